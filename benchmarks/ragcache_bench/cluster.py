"""``bench cluster``: L2 throughput on a 3-primary Redis Cluster against a single Redis, side by side.

Both are the same redis-server binary on loopback, started fresh by this benchmark; the cluster has a replica
per primary, so its writes replicate as they would in production. For batches of 32 and 1,000 keys (real key
form, 384 float32 per value: 1.5 KB, all-MiniLM-L6-v2's size) ``RedisTier.get_many`` and ``put_many`` run
interleaved call by call, the order alternating, and the medians give keys/s and the cluster/single ratio.

One client thread: this is what one replica's batch costs, not the cluster's total capacity, which grows with
its primaries (each a process, usually a machine, of its own) and which two shared cores cannot show.
"""

from __future__ import annotations

import time
from statistics import median

import torch
import xxhash

from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache.storage.embedded_redis_cluster import EmbeddedRedisCluster
from ragcache.storage.redis_client import open_redis
from ragcache.tiers.redis import RedisTier
from ragcache_bench.context import BenchContext
from ragcache_bench.report import BenchResult

__all__ = ["bench_cluster"]

BATCHES = (32, 1000)
DIM = 384
SPACE_ID = "0123456789abcdef"


def bench_cluster(ctx: BenchContext) -> BenchResult:
    result = BenchResult("cluster", "L2 get_many/put_many: 3-primary Redis Cluster vs one Redis")
    repeats = 21 if ctx.quick else 51
    generator = torch.Generator().manual_seed(ctx.seed)
    single, cluster = EmbeddedRedis(), EmbeddedRedisCluster()
    clients = {"single": open_redis(single.url, timeout_s=5.0), "cluster": open_redis(cluster.url, timeout_s=5.0)}
    try:
        tiers = {name: RedisTier(client, dim=DIM, dtype=torch.float32, ttl_s=3600) for name, client in clients.items()}
        details: dict = {"repeats": repeats, "dim": DIM, "primaries": len(cluster.primary_ports()), "batches": {}}
        for batch in BATCHES:
            samples = _race(tiers, batch, repeats, generator)
            details["batches"][batch] = samples
            _report(result, batch, samples)
        result.details = details
    finally:
        for client in clients.values():
            client.close()
        cluster.stop()
        single.stop()
    return result


def _race(tiers: dict[str, RedisTier], batch: int, repeats: int, generator: torch.Generator) -> dict:
    """Per target and operation, the wall and client-CPU seconds of each timed call; fresh keys every repeat."""
    samples: dict = {name: {op: [] for op in ("put", "get", "put_cpu", "get_cpu")} for name in tiers}
    names = list(tiers)
    for repeat in range(repeats + 1):
        keys = _keys(batch, repeat)
        vectors = torch.randn(batch, DIM, generator=generator)
        for name in names if repeat % 2 == 0 else names[::-1]:
            tier = tiers[name]
            put = _timed(tier.put_many, keys, vectors)
            get = _timed(tier.get_many, keys)
            hits = get[2]
            if hits.index != list(range(batch)) or not torch.equal(hits.vectors, vectors):
                raise RuntimeError(f"{name}: get_many did not return the {batch} vectors just stored")
            if repeat:  # the first round opens connections and fills pools: not timed
                for op, (wall_s, cpu_s, _) in (("put", put), ("get", get)):
                    samples[name][op].append(wall_s)
                    samples[name][f"{op}_cpu"].append(cpu_s)
    return samples


def _timed(call, *args):
    """(wall seconds, this process's CPU seconds, the result): CPU time shows what the client itself spent."""
    wall, cpu = time.perf_counter(), time.process_time()
    outcome = call(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, outcome


def _keys(batch: int, repeat: int) -> list[str]:
    digest = xxhash.xxh3_128_hexdigest
    return [f"rc:{SPACE_ID}:{digest(f'{batch}/{repeat}/{i}'.encode())}" for i in range(batch)]


def _report(result: BenchResult, batch: int, samples: dict) -> None:
    for operation in ("get", "put"):
        medians = {name: median(samples[name][operation]) for name in samples}
        for name, seconds in medians.items():
            cpu_ms = median(samples[name][f"{operation}_cpu"]) * 1000
            result.add(f"{batch} keys {operation}_many, {name}", seconds * 1000, "ms",
                       note=f"{batch / seconds:,.0f} keys/s; client CPU {cpu_ms:.2f} ms")
        result.add(f"{batch} keys {operation}_many, cluster / single time", medians["cluster"] / medians["single"], "x")
