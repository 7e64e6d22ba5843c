"""``bench ray``: bulk embedding on a real two-node Ray cluster through the shared cache (ragcache.ray).

The cluster: a head and a worker node on loopback (``ragcache_testing.ray_cluster``), with one Redis (L2 and
the single-flight locks) and one Milvus server (L3) that every actor shares, as on a real cluster.

1. Throughput with 1 and 2 actors, each on a fresh set of texts (every text computed once): the packaged
   local model, and the instant upstream (``ragcache_testing.instant``), in front of which the cache layer's
   own cost is what scales. Texts/s is counted from the first batch's start to the last batch's end, so the
   actors' start-up (loading the model) is left out; the whole pipeline's wall time is in the JSON.
2. Computed texts and wall time against a plain Ray Data pipeline without the cache (one model per actor,
   every row encoded), on the same corpus with duplicates (each distinct passage twice), side by side: a first
   run, then a second run after 1% of the distinct passages changed. Both pipelines use 2 actors.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ragcache_bench.context import BenchContext
from ragcache_bench.report import BenchResult, Target

__all__ = ["bench_ray"]

BATCH = 64
REPEATS = 2  # each distinct passage appears this many times in the corpus
CHANGED_FRACTION = 0.01
PRICE_PER_MILLION_TOKENS = 0.02  # what a hosted small embedding model bills, for the money-saved figure


class _Timed:
    """Wraps an embedder class's calls with each batch's start and end time (two extra columns)."""

    def __init__(self, make: Callable[[], Callable[[dict], dict]]):
        self.embed = make()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        started = time.time()
        batch = self.embed(batch)
        rows = len(batch["text"])
        batch["batch_started"] = np.full(rows, started)
        batch["batch_ended"] = np.full(rows, time.time())
        return batch


def _cached(settings, model: str | None) -> Callable[[], Callable[[dict], dict]]:
    from ragcache.ray import CachedEmbedder

    return lambda: CachedEmbedder(settings, "text", model=model)


def _plain(settings) -> Callable[[], Callable[[dict], dict]]:
    """A Ray Data embedding pipeline as it is written without a cache: the model in each actor, every row encoded."""

    def make() -> Callable[[dict], dict]:
        from ragcache.build import load_encoder

        encoder = load_encoder(settings)

        def embed(batch: dict) -> dict:
            batch["embedding"] = encoder.encode([str(text) for text in batch["text"]]).cpu().numpy()
            return batch

        return embed

    return make


def _run(texts: list[str], make: Callable[[], Callable[[dict], dict]], num_actors: int) -> tuple[Any, dict[str, float]]:
    """Embed ``texts`` with ``num_actors`` actors; the materialized output and its timings."""
    import ray
    from ray.data import ActorPoolStrategy

    dataset = ray.data.from_items([{"text": text} for text in texts], override_num_blocks=max(4, len(texts) // (4 * BATCH)))
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        output = dataset.map_batches(_Timed, fn_constructor_args=(make,), batch_size=BATCH, batch_format="numpy",
                                     compute=ActorPoolStrategy(size=num_actors), num_cpus=1,
                                     scheduling_strategy="SPREAD").materialize()
    wall_s = time.perf_counter() - started
    times = output.select_columns(["batch_started", "batch_ended"]).to_pandas()
    busy_s = float(times["batch_ended"].max() - times["batch_started"].min())
    return output, {"wall_s": wall_s, "busy_s": busy_s, "texts_per_s": len(texts) / busy_s}


def _report(output, settings, model: str | None = None):
    from ragcache.ray import embed_report

    return embed_report(output, "text", settings=settings, model=model)


def _fresh(passages: list[str], tag: str, count: int) -> list[str]:
    """``count`` texts no earlier run embedded (a tag in front of each passage)."""
    return [f"[{tag} {i}] {passages[i % len(passages)]}" for i in range(count)]


def _throughput(result: BenchResult, settings, passages: list[str], count: int, model: str | None, label: str) -> dict:
    figures: dict = {}
    for num_actors in (1, 2):
        output, timing = _run(_fresh(passages, f"{label}-{num_actors}", count), _cached(settings, model), num_actors)
        report = _report(output, settings, model)
        figures[num_actors] = {**timing, "computed": report.computed, "texts": report.texts}
        result.add(f"{label}: texts/s, {num_actors} actor{'s' if num_actors > 1 else ''}", timing["texts_per_s"], "texts/s",
                   requires={"every text computed once": report.computed == count},
                   note=f"{count:,} new texts; wall {timing['wall_s']:.1f} s with actor start-up")
    result.add(f"{label}: 2 actors / 1 actor", figures[2]["texts_per_s"] / figures[1]["texts_per_s"], "x",
               note="2 physical cores shared by both nodes (and the machine's other work)")
    return figures


def bench_ray(ctx: BenchContext) -> BenchResult:
    import ray

    from ragcache.settings import Settings
    from ragcache.storage.embedded_milvus import MilvusLiteServer
    from ragcache.storage.embedded_redis import EmbeddedRedis
    from ragcache_testing.instant import InstantUpstream
    from ragcache_testing.ray_cluster import NODE_ENV, RayCluster

    result = BenchResult("ray", "bulk embedding on a 2-node Ray cluster through the shared cache vs a plain Ray Data pipeline")
    distinct = 400 if ctx.quick else 2_000
    passages = list(ctx.corpus.passages[: distinct * 2])
    os.environ.update(NODE_ENV)
    redis_server = EmbeddedRedis()
    with contextlib.ExitStack() as stack:
        stack.callback(redis_server.stop)
        milvus = stack.enter_context(MilvusLiteServer(ctx.workdir / "ray-l3.db"))
        upstream = stack.enter_context(InstantUpstream())
        cluster = stack.enter_context(RayCluster(num_nodes=2, num_cpus=2, log_dir=ctx.workdir))
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            models = json.loads(upstream.models_json)
            models["models"][0]["price_per_million_tokens"] = PRICE_PER_MILLION_TOKENS
            settings = Settings(redis_url=redis_server.url, milvus_uri=milvus.url, data_dir=ctx.workdir / "ray",
                                models_json=json.dumps(models))
            local = _throughput(result, settings, passages, distinct, None, "local model")
            instant = _throughput(result, settings, passages, distinct * 4, upstream.model, "instant upstream")
            instant["re-run"] = _savings(result, settings, _fresh(passages, "instant upstream-2", distinct * 4), upstream.model)
            versus = _versus_plain(result, settings, passages[:distinct])
        finally:
            ray.shutdown()
    result.details = {"distinct": distinct, "repeats": REPEATS, "batch": BATCH, "local": local, "instant": instant, "versus": versus}
    return result


def _savings(result: BenchResult, settings, texts: list[str], model: str) -> dict:
    """A second run over texts the remote model already embedded: nothing sent upstream, tokens and money saved."""
    output, timing = _run(texts, _cached(settings, model), 2)
    report = _report(output, settings, model)
    result.add("instant upstream: re-run, tokens saved", report.tokens_saved or 0, "tokens",
               requires={"nothing sent upstream": report.computed == 0, "tokens saved counted": bool(report.tokens_saved)},
               note=f"{report.texts:,} texts from {report.served}; money saved {report.money_saved} at "
                    f"{PRICE_PER_MILLION_TOKENS}/M tokens; {timing['texts_per_s']:,.0f} texts/s")
    return {**timing, "computed": report.computed, "tokens_saved": report.tokens_saved, "money_saved": report.money_saved}


def _versus_plain(result: BenchResult, settings, distinct_texts: list[str]) -> dict:
    """The same corpus through both pipelines, a first run and a run after a 1% change, side by side."""
    corpus = [text for text in distinct_texts for _ in range(REPEATS)]
    num_changed = max(1, round(len(distinct_texts) * CHANGED_FRACTION))
    changed = {text: f"{text} (revised)" for text in distinct_texts[:num_changed]}
    runs: dict[str, dict] = {}
    for name, texts in (("first run", corpus), ("after a 1% change", [changed.get(text, text) for text in corpus])):
        _, plain = _run(texts, _plain(settings), 2)
        output, cached = _run(texts, _cached(settings, None), 2)
        report = _report(output, settings)
        runs[name] = {"plain": {**plain, "computed": len(texts)}, "cached": {**cached, "computed": report.computed},
                      "served": report.served}
        expected = len(distinct_texts) if name == "first run" else num_changed
        result.add(f"{name}: texts computed, plain / cache", len(texts) / max(report.computed, 1), "x",
                   target=Target(">=", REPEATS if name == "first run" else 50.0),
                   requires={"the cache computed each new distinct text once": report.computed == expected},
                   note=f"plain {len(texts):,}, cache {report.computed:,} ({len(distinct_texts):,} distinct x {REPEATS})")
        result.add(f"{name}: wall time, plain / cache", plain["wall_s"] / cached["wall_s"], "x",
                   note=f"plain {plain['wall_s']:.1f} s, cache {cached['wall_s']:.1f} s, both with actor start-up")
        result.add(f"{name}: time in batches, plain / cache", plain["busy_s"] / cached["busy_s"], "x",
                   note=f"plain {plain['busy_s']:.1f} s, cache {cached['busy_s']:.1f} s: first batch start to last batch end")
    return runs
