"""``ragcache bench providers``: ragcache in front of a real OpenAI-compatible upstream vs the upstream alone.

The upstream is Infinity (``infinity-emb``, its own venv: ``make infinity-env``) serving the packaged
all-MiniLM-L6-v2 on loopback; ragcache is the real service (``ragcache serve``) with that server configured
as a remote ``openai`` model. One client (httpx, one request at a time, base64 as the ``openai`` SDK sends)
talks to both, with the same texts in the same batches:

1. hot: a 32-text request whose texts are all in L1, against the same request to the upstream (>= 100x);
2. all-miss: batches no level holds, through ragcache and to the upstream alternately (ABBA order), texts/s of
   each; ragcache must keep >= 95% of the upstream's own rate (the cache must not slow the provider path);
3. Zipf: the bench's Zipf stream through both; the hit rate from ragcache's /stats against the ideal, the
   tokens billed (the model's tokenizer) with and without ragcache, tokens and money saved at a list price.

Every figure is judged under preconditions (every hot text from L1, every miss computed, ragcache's vectors
the upstream's own, each distinct text sent upstream once); a false one is a MISS.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import httpx
import numpy as np

from ragcache_bench.context import BATCH_SIZE, BenchContext
from ragcache_bench.report import BenchResult, Target, median
from ragcache_testing.service import ServiceProcess, served

__all__ = ["bench_providers"]

MODEL_NAME = "minilm-upstream"
# OpenAI's list price for text-embedding-3-small (USD per million tokens): what the money figures assume.
PRICE_PER_MILLION_TOKENS = 0.02
HOT_REPEATS = 7
# Infinity's vectors depend on the batch a text was computed in (padding): ~2e-7 here; ragcache sends the
# same 32-text batches, so its vectors match to this, and bit for bit when nothing else is in flight.
VECTOR_ATOL = 1e-5


def infinity_python() -> Path:
    """The Infinity venv's python: RAGCACHE_INFINITY_PYTHON (mk/infinity.mk exports it), else .venv-infinity."""
    python = Path(os.environ.get("RAGCACHE_INFINITY_PYTHON") or ".venv-infinity/bin/python")
    if not python.exists():
        raise RuntimeError(f"no Infinity environment at {python}: run `make infinity-env` (or set RAGCACHE_INFINITY_PYTHON)")
    return python


class _Client:
    """One httpx client, the same request shape to the upstream and to ragcache (OpenAI's, base64)."""

    def __init__(self, upstream_url: str, upstream_model: str, ragcache_url: str):
        self.http = httpx.Client(timeout=120.0)
        self.targets = {
            "upstream": (f"{upstream_url}/embeddings", upstream_model),
            "ragcache": (f"{ragcache_url}/v1/embeddings", MODEL_NAME),
        }

    def embed(self, target: str, texts: list[str]) -> tuple[float, httpx.Response, np.ndarray]:
        url, model = self.targets[target]
        started = time.perf_counter()
        response = self.http.post(url, json={"model": model, "input": texts, "encoding_format": "base64"})
        elapsed = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"{target} answered {response.status_code}: {response.text[:300]}")
        rows = [base64.b64decode(item["embedding"]) for item in response.json()["data"]]
        return elapsed, response, np.frombuffer(b"".join(rows), dtype="<f4").reshape(len(rows), -1)

    def close(self) -> None:
        self.http.close()


def bench_providers(ctx: BenchContext) -> BenchResult:
    from ragcache_testing.infinity import InfinityServer, InfinityServerConfig, packaged_model_folder

    result = BenchResult("providers", "ragcache in front of a real upstream (Infinity) vs the upstream alone")
    folder = packaged_model_folder()
    config = InfinityServerConfig(python=infinity_python(), model=folder, log_path=ctx.workdir / "infinity.log")
    with InfinityServer(config) as upstream:
        service = ServiceProcess(ctx.workdir, redis_url=ctx.redis_url, extra_env=_service_env(upstream, folder))
        client = _Client(upstream.base_url, upstream.model_id, service.url)
        try:
            result.details["upstream"] = {"server": "infinity-emb", "model": upstream.model_id, "startup_s": upstream.startup_s}
            _hot(ctx, client, result)
            _all_miss(ctx, client, result)
            _zipf(ctx, client, service, result, folder)
        finally:
            client.close()
            service.stop()
    return result


def _service_env(upstream, folder: Path) -> dict[str, str]:
    model = {
        "name": MODEL_NAME, "provider": "openai", "base_url": upstream.base_url, "upstream_model": upstream.model_id,
        "dimensions": 384, "normalize": True, "max_inputs": BATCH_SIZE, "tokenizer": str(folder),
        "price_per_million_tokens": PRICE_PER_MILLION_TOKENS,
    }
    # The remote model is the default: the service loads no local model (nothing else competes for the CPU).
    return {"RAGCACHE_MODELS_JSON": json.dumps({"models": [model]}), "RAGCACHE_MODEL": MODEL_NAME,
            "RAGCACHE_DRIFT_CHECK_INTERVAL_S": "0"}


def _hot(ctx: BenchContext, client: _Client, result: BenchResult) -> None:
    """One 32-text request, all from L1, against the same request to the upstream (medians, side by side)."""
    texts = ctx.unseen_texts(BATCH_SIZE, skip=7000)
    _, first, computed = client.embed("ragcache", texts)
    _, _, own = client.embed("upstream", texts)
    client.embed("upstream", texts)  # warm-up of both paths
    client.embed("ragcache", texts)
    upstream_s, hot_s, all_l1 = [], [], True
    for _ in range(HOT_REPEATS):
        upstream_s.append(client.embed("upstream", texts)[0])
        elapsed, response, vectors = client.embed("ragcache", texts)
        hot_s.append(elapsed)
        all_l1 = all_l1 and served(response)["L1"] == BATCH_SIZE and np.array_equal(vectors, computed)
    same = bool(np.allclose(computed, own, rtol=0, atol=VECTOR_ATOL))
    result.add("upstream, 32 texts", median(upstream_s) * 1000, "ms", note=f"median of {HOT_REPEATS}")
    result.add("ragcache, 32 texts from L1", median(hot_s) * 1000, "ms", note=f"median of {HOT_REPEATS}")
    result.add("hot: upstream / ragcache", median(upstream_s) / median(hot_s), "x", target=Target(">=", 100),
               note="same request, one client, over loopback HTTP",
               requires={"first request computed": served(first)["Compute"] == BATCH_SIZE,
                         "every hot text from L1": all_l1, "vectors are the upstream's": same})


def _all_miss(ctx: BenchContext, client: _Client, result: BenchResult) -> None:
    """Batches no level holds, alternately to each (ABBA: neither always goes first), texts/s of each."""
    num_batches = 8 if ctx.quick else 32
    texts = ctx.unseen_texts(num_batches * BATCH_SIZE, skip=8000)
    seconds = {"upstream": 0.0, "ragcache": 0.0}
    all_computed, same = True, True
    for index in range(num_batches):
        batch = texts[index * BATCH_SIZE : (index + 1) * BATCH_SIZE]
        order = ("upstream", "ragcache") if index % 4 in (0, 3) else ("ragcache", "upstream")
        answers = {}
        for target in order:
            elapsed, response, vectors = client.embed(target, batch)
            seconds[target] += elapsed
            answers[target] = vectors
            if target == "ragcache":
                all_computed = all_computed and served(response)["Compute"] == BATCH_SIZE
        same = same and bool(np.allclose(answers["ragcache"], answers["upstream"], rtol=0, atol=VECTOR_ATOL))
    num_texts = num_batches * BATCH_SIZE
    upstream_rate, ragcache_rate = num_texts / seconds["upstream"], num_texts / seconds["ragcache"]
    result.add("all-miss: upstream alone", upstream_rate, "texts/s", note=f"{num_batches} batches of {BATCH_SIZE}")
    result.add("all-miss: through ragcache", ragcache_rate, "texts/s", note="L1, L2 (Redis) and L3 (Milvus Lite) written")
    result.add("all-miss: ragcache / upstream", ragcache_rate / upstream_rate, "x", target=Target(">=", 0.95),
               note="the same batches, alternately (ABBA)",
               requires={"every text computed": all_computed, "vectors are the upstream's": same})


def _zipf(ctx: BenchContext, client: _Client, service: ServiceProcess, result: BenchResult, folder: Path) -> None:
    """The Zipf stream through each; tokens billed with and without ragcache; tokens and money saved.

    Tokens are counted with the model's own tokenizer (what a provider bills): Infinity's ``usage`` counts
    characters unless started with ``--lengths-via-tokenize``, so it is kept in the JSON only."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    # The sentence-transformers limit (256 for all-MiniLM-L6-v2), not the tokenizer's own (512).
    max_length = int(json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"])
    num_batches = min(len(ctx.stream.batches), 40 if ctx.quick else 200)
    before = _model_stats(service)
    seen: set[str] = set()
    seconds = {"upstream": 0.0, "ragcache": 0.0}
    tokens_alone = tokens_sent = upstream_usage = 0
    computed_once = True
    for index in range(num_batches):
        batch = ctx.batch(index)
        elapsed, response, _ = client.embed("upstream", batch)
        seconds["upstream"] += elapsed
        upstream_usage += int(response.json()["usage"]["prompt_tokens"])
        elapsed, response, _ = client.embed("ragcache", batch)
        seconds["ragcache"] += elapsed
        tokens = dict(zip(batch, _count_tokens(tokenizer, batch, max_length)))
        tokens_alone += sum(tokens[text] for text in batch)
        # X-Cache-Compute counts a request's repeats of a computed text each time; the model saw it once.
        computed_once = computed_once and served(response)["Compute"] == sum(text not in seen for text in batch)
        new = set(batch) - seen
        tokens_sent += sum(tokens[text] for text in new)
        seen |= new
    after = _model_stats(service)
    num_texts = after["texts"] - before["texts"]
    hit_rate = (after["hits"] - before["hits"]) / num_texts if num_texts else 0.0
    sent_once = after["sent"] - before["sent"] == len(seen)
    ideal = 1 - len(seen) / (num_batches * BATCH_SIZE)
    saved = tokens_alone - tokens_sent
    money = saved * PRICE_PER_MILLION_TOKENS / 1e6
    result.details["zipf"] = {"batches": num_batches, "texts": num_batches * BATCH_SIZE, "distinct": len(seen),
                              "tokens_alone": tokens_alone, "tokens_through_ragcache": tokens_sent,
                              "infinity_usage_characters": upstream_usage, "ragcache_stats_before": before,
                              "ragcache_stats_after": after}
    result.add("Zipf: hit rate (ragcache's /stats)", hit_rate, "", target=Target(">=", ideal - 0.005),
               note=f"ideal (each distinct text computed once) {ideal:.3f}; {num_batches} batches of {BATCH_SIZE}",
               requires={"each distinct text computed once": computed_once, "each sent upstream once (/stats)": sent_once,
                         "every text counted": num_texts == num_batches * BATCH_SIZE})
    result.add("Zipf: tokens billed, upstream alone", tokens_alone, "tokens", note="every text, the model's tokenizer")
    result.add("Zipf: tokens billed, through ragcache", tokens_sent, "tokens", note="the distinct texts ragcache sent")
    result.add("Zipf: tokens saved", saved / tokens_alone if tokens_alone else 0.0, "fraction",
               note=f"{saved:,} tokens; ${money:.4f} at ${PRICE_PER_MILLION_TOKENS}/M tokens "
                    f"(${money / (num_batches * BATCH_SIZE) * 1e6:.2f} per million requested texts of this mix)")
    result.add("Zipf: stream time, upstream / ragcache", seconds["upstream"] / seconds["ragcache"], "x",
               note=f"{seconds['upstream']:.1f} s vs {seconds['ragcache']:.1f} s")


def _model_stats(service: ServiceProcess) -> dict[str, int]:
    """Texts asked for, hits, and texts sent upstream, from ragcache's own /stats."""
    model = service.client.get("/stats").json()["models"][MODEL_NAME]
    since = model["since_start"]
    return {"texts": since["texts"], "hits": since["hits"], "sent": (model.get("upstream") or {}).get("num_texts", 0)}


def _count_tokens(tokenizer, texts: list[str], max_length: int) -> list[int]:
    """Tokens per text as the model takes them (special tokens in, truncated at the model's limit)."""
    encoded = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)
    return [len(ids) for ids in encoded["input_ids"]]
