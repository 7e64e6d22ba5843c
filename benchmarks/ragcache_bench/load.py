"""``ragcache bench load``: a bounded, mixed load on the real service, counting every failure.

    ragcache bench load --duration 60 --clients 50      # the run docs/reliability.md reports

``clients`` asyncio tasks (one httpx connection each) send, back to back, a mix of /embed (1-8 texts),
/v1/embeddings (1-4 texts) and /search over a small knowledge base, drawn from a seeded, skewed stream
(many repeats, a steady trickle of new texts, so every level and the model stay busy). The service is a
separate process (``ragcache serve``) with its own embedded Redis and Milvus Lite; its resident memory is
read after a warm-up and every 5 s of the run, and L1's bytes against its budget from ``/stats``. The fault tests reuse
``LoadRunner`` as their background load.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

__all__ = ["Outcome", "Workload", "LoadRunner", "LoadSummary", "LoadRun", "summarize", "run_load", "add_arguments", "run"]

WORDS = (
    "cache vector redis milvus query prompt token model batch index search document latency replica "
    "memory disk shard cluster embed retrieval answer context window prefix warm evict level hit miss"
).split()
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Outcome:
    """One request: ``status`` 0 when it never got an answer (connection refused, reset, timed out)."""

    endpoint: str
    status: int
    started_s: float  # time.monotonic() when sent
    latency_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Workload:
    """Seeded request bodies: texts repeated from a hot pool (skewed or uniform), plus never-seen ones."""

    def __init__(
        self,
        *,
        collection: str = "load",
        num_hot: int = 300,
        skew: float = 1.2,
        new_fraction: float = 0.1,
        num_new: int | None = None,
        seed: int = 0,
        paths: tuple[str, ...] = ("/embed", "/v1/embeddings", "/search"),
    ):
        """``skew``: the Pareto shape of hot-text popularity (0: every hot text equally often);
        ``new_fraction``: the share of texts never sent before; ``num_new``: at most this many of them, then they
        come round again (a bounded corpus: ``corpus`` lists it; None: each is new, without end)."""
        self.collection = collection
        self.paths = paths
        self.skew = skew
        self.new_fraction = new_fraction
        self._rng = random.Random(seed)
        self._hot = [self.sentence(i) for i in range(num_hot)]
        self._num_hot, self._num_new = num_hot, num_new
        self._next_new = num_hot
        self._lock = threading.Lock()

    @property
    def hot_texts(self) -> list[str]:
        """The texts most requests repeat (send them once first to warm the levels)."""
        return list(self._hot)

    def corpus(self) -> list[str]:
        """Every text this workload can send, with ``num_new`` set (the hot ones, then the others)."""
        if self._num_new is None:
            raise ValueError("an unbounded workload has no corpus")
        return [*self._hot, *(self.sentence(self._num_hot + i) for i in range(self._num_new))]

    def sentence(self, index: int) -> str:
        words = random.Random(index).choices(WORDS, k=8)
        return f"{' '.join(words)} #{index}"

    def documents(self, count: int) -> list[dict]:
        return [{"id": f"doc-{i}", "text": self.sentence(10_000_000 + i), "metadata": {"n": i}} for i in range(count)]

    def _texts(self, count: int) -> list[str]:
        with self._lock:
            texts = []
            for _ in range(count):
                if self._rng.random() < self.new_fraction:  # a new text: a miss at every level, computed
                    texts.append(self.sentence(self._next_new))
                    self._next_new += 1
                    if self._num_new is not None and self._next_new == self._num_hot + self._num_new:
                        self._next_new = self._num_hot
                elif self.skew:  # a hot text, Zipf-like: low indexes far more often
                    texts.append(self._hot[min(int(self._rng.paretovariate(self.skew)) - 1, len(self._hot) - 1)])
                else:
                    texts.append(self._rng.choice(self._hot))
            return texts

    def next_request(self) -> tuple[str, dict]:
        with self._lock:
            path = self._rng.choice(self.paths)
            size = self._rng.randint(1, 8 if path == "/embed" else 4)
        if path == "/embed":
            return path, {"inputs": self._texts(size)}
        if path == "/v1/embeddings":
            return path, {"input": self._texts(size), "model": MODEL}
        return path, {"collection": self.collection, "query": self._texts(1)[0], "top_k": 5}


class LoadRunner:
    """``clients`` asyncio tasks on a thread of their own, each sending its next request when the last
    returns, until ``stop()``; every request is recorded as an ``Outcome``."""

    def __init__(self, url: str, workload: Workload, *, clients: int, timeout_s: float = 60.0):
        self.url = url
        self.workload = workload
        self.clients = clients
        self.timeout_s = timeout_s
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="ragcache-load", daemon=True)

    def start(self) -> LoadRunner:
        self._thread.start()
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 30)
        return list(self.outcomes)

    def __enter__(self) -> LoadRunner:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        async with httpx.AsyncClient(base_url=self.url, limits=limits, timeout=self.timeout_s) as client:
            await asyncio.gather(*(self._client(client) for _ in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            path, body = self.workload.next_request()
            started = time.monotonic()
            try:
                response = await client.post(path, json=body)
            except httpx.TransportError as exc:
                self.outcomes.append(Outcome(path, 0, started, time.monotonic() - started, f"{type(exc).__name__}: {exc}"))
                await asyncio.sleep(0.05)  # a refused connection returns at once: do not spin
                continue
            error = None if response.is_success else response.text[:300]
            self.outcomes.append(Outcome(path, response.status_code, started, time.monotonic() - started, error))


@dataclass(frozen=True)
class LoadSummary:
    num_requests: int
    num_failed: int
    by_endpoint: dict[str, int]
    by_status: dict[int, int]
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    first_errors: tuple[str, ...]


def summarize(outcomes: list[Outcome]) -> LoadSummary:
    """Counts per endpoint and status, latency percentiles, and the first few errors verbatim."""
    latencies = np.array([o.latency_s for o in outcomes] or [0.0]) * 1000
    failed = [o for o in outcomes if not o.ok]
    return LoadSummary(
        num_requests=len(outcomes),
        num_failed=len(failed),
        by_endpoint=dict(Counter(o.endpoint for o in outcomes)),
        by_status=dict(Counter(o.status for o in outcomes)),
        latency_p50_ms=round(float(np.percentile(latencies, 50)), 1),
        latency_p99_ms=round(float(np.percentile(latencies, 99)), 1),
        latency_max_ms=round(float(latencies.max()), 1),
        first_errors=tuple(f"{o.endpoint} {o.status}: {o.error}" for o in failed[:5]),
    )


# ---- the benchmark --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--l1-bytes", type=int, default=1024 * 1024, help="the service's L1 budget (small, so it fills and evicts)")
    parser.add_argument("--documents", type=int, default=500, help="knowledge-base size for /search")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for load.json")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


@dataclass(frozen=True)
class LoadRun:
    """A whole run: the summary, and the service's memory before and after."""

    summary: LoadSummary
    duration_s: float
    clients: int
    rss_start_bytes: int
    rss_end_bytes: int
    rss_samples_bytes: tuple[int, ...]  # every 5 s during the run
    l1_used_bytes: int
    l1_budget_bytes: int
    stats: dict


def run_load(*, duration_s: float, clients: int, l1_bytes: int, num_documents: int, workdir: Path,
             quiet: bool = True) -> LoadRun:
    """Start Redis and the service, ingest, warm up, then load it for ``duration_s``; stop everything."""
    import psutil

    from ragcache.storage.embedded_redis import EmbeddedRedis
    from ragcache_testing.service import ServiceProcess

    redis_server = EmbeddedRedis()
    try:
        service = ServiceProcess(workdir, redis_url=redis_server.url, extra_env={"RAGCACHE_L1_BYTES": str(l1_bytes)})
        try:
            workload = Workload()
            documents = workload.documents(num_documents)
            for start in range(0, len(documents), 250):
                service.post("/documents", {"collection": workload.collection, "documents": documents[start : start + 250]})
            LoadRunner(service.url, workload, clients=min(clients, 8)).start().stop()  # opens connections, fills L1 once
            process = psutil.Process(service.process.pid)
            rss_start = process.memory_info().rss
            runner = LoadRunner(service.url, workload, clients=clients).start()
            rss_samples = _sample_rss(process, duration_s, quiet=quiet)
            outcomes = runner.stop()
            rss_end = process.memory_info().rss
            stats = service.client.get("/stats").json()
        finally:
            service.stop()
    finally:
        redis_server.stop()
    l1 = stats["models"][MODEL]["levels"]["L1"]
    return LoadRun(summarize(outcomes), duration_s, clients, rss_start, rss_end, tuple(rss_samples),
                   l1["used_bytes"], l1["capacity_bytes"], stats)


def _sample_rss(process, duration_s: float, interval_s: float = 5.0, quiet: bool = True) -> list[int]:
    """The process's resident bytes every ``interval_s`` for ``duration_s``: growth that flattens is caches
    filling; growth that keeps its slope to the end would be a leak. A progress bar counts the seconds."""
    from ragcache.observe.progress import progress_bar

    samples, started = [], time.monotonic()
    deadline = started + duration_s
    with progress_bar(desc="load", unit="s", total=round(duration_s), quiet=quiet) as bar:
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(interval_s, left))
            samples.append(process.memory_info().rss)
            bar.update(min(round(time.monotonic() - started), bar.total) - bar.n)
            bar.set_postfix_str(f"RSS {samples[-1] / 2**20:.0f} MiB")
    return samples


def run(args: argparse.Namespace) -> int:
    """``ragcache bench load``: print the figures, write ``<out>/load.json``; exit 1 on any failed request."""
    from dataclasses import asdict

    from ragcache_bench.report import machine_info, write_json

    with tempfile.TemporaryDirectory(prefix="ragcache-load-") as workdir:
        result = run_load(duration_s=args.duration, clients=args.clients, l1_bytes=args.l1_bytes,
                          num_documents=args.documents, workdir=Path(workdir), quiet=args.quiet)
    summary = result.summary
    mib = 1024 * 1024
    print(f"load: {result.clients} clients for {result.duration_s:.0f} s: {summary.num_requests} requests "
          f"({summary.num_requests / result.duration_s:.0f}/s), {summary.num_failed} failed")
    print(f"  by endpoint {summary.by_endpoint}; by status {summary.by_status}")
    print(f"  latency p50 {summary.latency_p50_ms} ms, p99 {summary.latency_p99_ms} ms, max {summary.latency_max_ms} ms")
    print(f"  service RSS {result.rss_start_bytes / mib:.0f} MiB at start, {result.rss_end_bytes / mib:.0f} MiB at end; "
          f"L1 {result.l1_used_bytes / mib:.1f} of {result.l1_budget_bytes / mib:.1f} MiB")
    print(f"  RSS every 5 s (MiB): {' '.join(f'{rss / mib:.0f}' for rss in result.rss_samples_bytes)}")
    for error in summary.first_errors:
        print(f"  error: {error}")
    command = f"ragcache bench load --duration {args.duration:g} --clients {args.clients}"
    payload = {"command": command, "machine": machine_info(), "result": asdict(result)}
    path = write_json(args.out / "load.json", payload)
    print(f"JSON in {path}")
    return 0 if summary.num_failed == 0 else 1
