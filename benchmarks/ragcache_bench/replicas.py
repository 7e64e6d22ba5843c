"""``bench replicas``: two service processes sharing one Redis (L2) and one Milvus server (L3).

- Shared hits: replica 1 embeds texts no level holds; replica 2 then asks for the same texts. The figure is the
  hit rate replica 2 sees (served by a shared level, not computed), and where those hits came from.
- Single flight: both replicas are sent the same fresh texts at the same moment, once with the cross-replica
  lock (``RAGCACHE_SINGLE_FLIGHT=true``, the default) and once without it, each run on its own pair of replicas
  and its own texts. The figure is texts computed per distinct text (1.0 = each computed once in the fleet).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ragcache.storage.embedded_milvus import MilvusLiteServer
from ragcache_bench.context import BATCH_SIZE, BenchContext
from ragcache_bench.report import BenchResult, Target, median
from ragcache_testing.replicas import start_replicas, stop_replicas
from ragcache_testing.service import LEVELS, ServiceProcess, served

__all__ = ["bench_replicas"]


def bench_replicas(ctx: BenchContext) -> BenchResult:
    result = BenchResult("replicas", "two replicas sharing one Redis (L2) and one Milvus server (L3)")
    num_texts = 128 if ctx.quick else 1024
    workdir = ctx.workdir / "replicas"
    with MilvusLiteServer(workdir / "l3.db") as milvus:
        for enable_lock in (True, False):
            ctx.redis_client.flushdb()
            env = {"RAGCACHE_SINGLE_FLIGHT": str(enable_lock).lower()}
            replicas = start_replicas(workdir, 2, redis_url=ctx.redis_url, milvus_url=milvus.url, extra_env=env)
            try:
                if enable_lock:
                    _shared_hits(ctx.unseen_texts(num_texts, skip=6000), replicas, result)
                skip = 8000 if enable_lock else 8000 + num_texts
                _simultaneous_misses(ctx.unseen_texts(num_texts, skip=skip), replicas, result, enable_lock)
            finally:
                stop_replicas(replicas)
    ctx.redis_client.flushdb()
    return result


def _batches(texts: list[str]) -> list[list[str]]:
    return [texts[start : start + BATCH_SIZE] for start in range(0, len(texts), BATCH_SIZE)]


def _shared_hits(texts: list[str], replicas: list[ServiceProcess], result: BenchResult) -> None:
    """Replica 1 computes; replica 2 asks for the same texts: what share does it not compute?"""
    first, second = replicas
    totals = {1: dict.fromkeys(LEVELS, 0), 2: dict.fromkeys(LEVELS, 0)}
    latencies: dict[int, list[float]] = {1: [], 2: []}
    for batch in _batches(texts):
        for number, replica in ((1, first), (2, second)):
            started = time.perf_counter()
            response = replica.post("/embed", {"inputs": batch})
            latencies[number].append(time.perf_counter() - started)
            for level, count in served(response).items():
                totals[number][level] += count
    hit_rate = 1 - totals[2]["Compute"] / len(texts)
    result.add("replica 2 hit rate on texts replica 1 computed", hit_rate, target=Target(">=", 0.99),
               note=f"{len(texts)} texts; replica 1 computed {totals[1]['Compute']}; replica 2 served by "
                    + ", ".join(f"{level} {count}" for level, count in totals[2].items()))
    result.add("/embed 32 texts: replica 1 (computed)", median(latencies[1]) * 1000, "ms")
    result.add("/embed 32 texts: replica 2 (shared level)", median(latencies[2]) * 1000, "ms")
    result.details["shared_hits"] = {"num_texts": len(texts), "served_replica_1": totals[1], "served_replica_2": totals[2]}


def _simultaneous_misses(texts: list[str], replicas: list[ServiceProcess], result: BenchResult, enable_lock: bool) -> None:
    """Both replicas get every batch at the same moment; count what the fleet computed."""
    computed = [0, 0]
    start = threading.Barrier(len(replicas))

    def send(number: int, replica: ServiceProcess) -> None:
        for batch in _batches(texts):
            start.wait(timeout=300)
            computed[number] += served(replica.post("/embed", {"inputs": batch}))["Compute"]

    started = time.perf_counter()
    with ThreadPoolExecutor(len(replicas)) as pool:
        for future in [pool.submit(send, number, replica) for number, replica in enumerate(replicas)]:
            future.result()
    seconds = time.perf_counter() - started
    label = "with lock" if enable_lock else "without lock"
    ratio = sum(computed) / len(texts)
    result.add(f"computed per distinct text, both replicas at once, {label}", ratio, "x",
               target=Target("<=", 1.0) if enable_lock else None,
               note=f"{len(texts)} texts in batches of {BATCH_SIZE}; computed by replica 1/2: {computed[0]}/{computed[1]}; {seconds:.1f} s")
    result.details[f"simultaneous_{label.replace(' ', '_')}"] = {"num_texts": len(texts), "computed": computed, "seconds": seconds}
