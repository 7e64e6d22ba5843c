"""``ragcache bench soak``: the service on its embedded defaults under a steady load for a bounded time, its memory
sampled, to show that every process levels off (issue 38, item 18).

    ragcache bench soak --seconds 480 --workers 2 --out benchmarks/results/r11-<commit>

``ragcache serve --workers N`` with the embedded Redis and the shared Milvus Lite (no URL set), a small L1 (so it
fills and evicts), a knowledge base for ``/search``, and ``bench load``'s seeded mix (``Workload``: /embed,
/v1/embeddings, /search; hot texts repeated, one text in ten from the rest of the corpus).

The corpus is bounded (``--corpus`` texts) and sent whole before the clock starts (/embed, /v1/embeddings and
/search/batch: each in-process memo and level has then seen every text the run will send). Why: an unbounded stream
of new texts fills the memos (the texts-seen record and the token-count memo keep 100,000 texts each, the key memo
32,768) at the load's rate, about 50 minutes here, so a run of minutes measured their filling, not a plateau
(a 480 s run: +1.4 and +2.3 MiB/min per worker at its end). Their bounds are in docs/SECURITY.md's table, measured
per entry; what the soak shows is that, with every cache holding what it will hold, nothing else grows.

Every ``--every`` seconds: each worker's RSS, the Milvus Lite server's and Redis's, and ``milvus.db``'s bytes. The
verdict: a series has levelled off when it grows by at most ``FLAT_MIB_PER_MIN`` over the run's last half (least
squares); a worker that has not fails the run (exit 1). The first half's slope is shown beside it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["SoakRun", "add_arguments", "levelled", "run", "run_soak"]

FLAT_MIB_PER_MIN = 0.5  # growth over the last half at most this: flat (30 MiB an hour at most)
DEFAULT_CORPUS = 10_000  # texts: below every memo's bound, so each holds the whole corpus
_WARM_BATCH = 256  # texts per warm-up request (/search/batch takes at most 256 queries)


@dataclass(frozen=True)
class Series:
    """One process (or file) over the run: bytes at each sample, and the verdict."""

    name: str
    bytes: tuple[int, ...]
    first_half_mib_per_min: float
    last_half_mib_per_min: float
    levelled_off: bool


@dataclass(frozen=True)
class SoakRun:
    seconds: float
    workers: int
    clients: int
    corpus_texts: int
    warmup_s: float
    sample_every_s: float
    times_s: tuple[float, ...]
    series: tuple[Series, ...]
    num_requests: int
    num_failed: int
    latency_p50_ms: float
    latency_p99_ms: float
    first_errors: tuple[str, ...]


def slope_mib_per_min(times_s: list[float], values: list[int]) -> float:
    """Least-squares growth of ``values`` (bytes) in MiB per minute (0 for fewer than two samples)."""
    if len(values) < 2:
        return 0.0
    mean_t, mean_v = sum(times_s) / len(times_s), sum(values) / len(values)
    spread = sum((t - mean_t) ** 2 for t in times_s)
    if not spread:
        return 0.0
    slope = sum((t - mean_t) * (v - mean_v) for t, v in zip(times_s, values)) / spread
    return slope * 60 / 2**20


def levelled(name: str, times_s: list[float], values: list[int]) -> Series:
    """The series with its first- and last-half growth and whether it levelled off: flat over the last half,
    however fast it grew before (see the module docstring)."""
    half = max(2, len(values) // 2)
    first = slope_mib_per_min(times_s[:half], values[:half])
    last = slope_mib_per_min(times_s[-half:], values[-half:])
    return Series(name, tuple(values), round(first, 2), round(last, 2), last <= FLAT_MIB_PER_MIN)


def warm_up(service, workload) -> None:
    """Send the whole corpus once on each path the load uses, so that every memo and level holds it."""
    from ragcache_bench.load import MODEL

    corpus = workload.corpus()
    for start in range(0, len(corpus), _WARM_BATCH):
        texts = corpus[start : start + _WARM_BATCH]
        service.post("/embed", {"inputs": texts})
        service.post("/v1/embeddings", {"input": texts, "model": MODEL})
        service.post("/search/batch", {"collection": workload.collection, "queries": texts, "top_k": 5})


def _processes(root_pid: int, workers: int) -> dict[str, int]:
    """RSS of the service's processes by role: ``worker-<pid>`` (the launcher itself with one worker), ``milvus``,
    ``redis``, ``launcher``."""
    import psutil

    found: dict[str, int] = {}
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for process in tree:
        try:
            name, command = process.name(), " ".join(process.cmdline())
            rss = process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "milvus" in name:
            found["milvus"] = found.get("milvus", 0) + rss
        elif "redis" in name:
            found["redis"] = found.get("redis", 0) + rss
        elif process.pid == root_pid:
            found["launcher" if workers > 1 else f"worker-{process.pid}"] = rss
        elif "multiprocessing" in command and "resource_tracker" not in command:
            found[f"worker-{process.pid}"] = rss
    return found


def run_soak(*, seconds: float, workers: int, clients: int, every_s: float, workdir: Path, corpus: int = DEFAULT_CORPUS,
             quiet: bool = True) -> SoakRun:
    from ragcache.observe.progress import progress_bar
    from ragcache_bench.load import LoadRunner, Workload, summarize
    from ragcache_testing.service import ServiceProcess

    service = ServiceProcess(workdir, redis_url=None, workers=workers,
                             extra_env={"RAGCACHE_L1_BYTES": str(1 << 20), "RAGCACHE_WRITE_BEHIND": "true"})
    try:
        workload = Workload(seed=0, num_new=corpus)
        documents = workload.documents(200)
        service.post("/documents", {"collection": workload.collection, "documents": documents})
        warm_started = time.monotonic()
        warm_up(service, workload)
        warmup_s = round(time.monotonic() - warm_started, 1)
        runner = LoadRunner(service.url, workload, clients=clients).start()
        started = time.monotonic()
        times: list[float] = []
        samples: list[dict[str, int]] = []
        with progress_bar(desc="soak", unit="s", total=round(seconds), quiet=quiet) as bar:
            while (left := started + seconds - time.monotonic()) > 0:
                time.sleep(min(every_s, left))
                sample = _processes(service.process.pid, workers)
                sample["milvus.db"] = sum(path.stat().st_size for path in workdir.rglob("milvus.db*") if path.is_file())
                times.append(round(time.monotonic() - started, 1))
                samples.append(sample)
                bar.update(min(round(time.monotonic() - started), bar.total) - bar.n)
        outcomes = runner.stop()
    finally:
        service.stop()
    names = sorted({name for sample in samples for name in sample})
    series = tuple(levelled(name, times, [sample.get(name, 0) for sample in samples]) for name in names)
    summary = summarize(outcomes)
    return SoakRun(seconds, workers, clients, corpus, warmup_s, every_s, tuple(times), series, summary.num_requests, summary.num_failed,
                   summary.latency_p50_ms, summary.latency_p99_ms, summary.first_errors)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=120.0, help="seconds of load, the bound of the run (default 120)")
    parser.add_argument("--workers", type=int, default=2, help="service worker processes (default 2)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--corpus", type=int, default=DEFAULT_CORPUS,
                        help=f"distinct texts the load draws from, all sent before the clock starts (default {DEFAULT_CORPUS})")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between memory samples (default 5)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for soak.json")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Print each process's growth in the first and last third, write ``<out>/soak.json``; exit 1 when a request
    failed or a worker did not level off."""
    from ragcache_bench.report import machine_info, write_json

    with tempfile.TemporaryDirectory(prefix="ragcache-soak-") as workdir:
        result = run_soak(seconds=args.seconds, workers=args.workers, clients=args.clients, every_s=args.every,
                          workdir=Path(workdir), corpus=args.corpus, quiet=args.quiet)
    print(f"soak: {result.corpus_texts} texts sent first ({result.warmup_s:.0f} s), then {result.workers} workers, "
          f"{result.clients} clients, {result.seconds:.0f} s: {result.num_requests} requests, "
          f"{result.num_failed} failed; latency p50 {result.latency_p50_ms} ms, p99 {result.latency_p99_ms} ms")
    print(f"  {'process':<16} {'first':>8} {'last':>8} {'MiB first -> last sample':>26}  levelled off")
    for series in result.series:
        shown = f"{series.bytes[0] / 2**20:.0f} -> {series.bytes[-1] / 2**20:.0f}" if series.bytes else "-"
        print(f"  {series.name:<16} {series.first_half_mib_per_min:>8.2f} {series.last_half_mib_per_min:>8.2f} {shown:>26}  "
              f"{'yes' if series.levelled_off else 'NO'}")
    print(f"  (growth in MiB per minute over the run's first and last half; levelled off: at most {FLAT_MIB_PER_MIN} over the last)")
    for error in result.first_errors:
        print(f"  error: {error}")
    command = (f"ragcache bench soak --seconds {args.seconds:g} --workers {args.workers} --clients {args.clients} "
               f"--corpus {args.corpus}")
    path = write_json(args.out / "soak.json", {"command": command, "machine": machine_info(), "result": asdict(result)})
    print(f"JSON in {path}")
    workers_levelled = all(series.levelled_off for series in result.series if series.name.startswith("worker-"))
    return 0 if result.num_failed == 0 and workers_levelled else 1
