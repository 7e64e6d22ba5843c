"""``bench levels``: what one ``embed`` call costs when every text comes from one level, per level; and the disk
level's own targets (issue 28, target 4).

For batches of 32 and 1,000 texts: served entirely by L1, by the disk level (L1 emptied), by L2 (L1 and the disk
level emptied), by L3 (those and Redis emptied), and computed (texts no level holds). Reports the median latency and
the texts/s it implies, and each level's speed-up over computing. Levels are found by name (the table of levels,
``ragcache.build.LEVELS``), never by position.

The disk level against Redis, in this process, side by side: the CPU of reading the same 32 keys (the client's and,
for Redis, its server process's: a local read must beat the network hop) and of writing them; its byte bound after
writing five budgets' worth; and a restart: a text written before it is served from disk after it.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from statistics import median

import torch

from ragcache_bench.context import BenchContext
from ragcache_bench.overhead import process_tree_cpu_s
from ragcache_bench.report import BenchResult, Target

BATCHES = (32, 1000)
LEVEL_NAMES = ("L1", "disk", "L2", "L3")


def bench_levels(ctx: BenchContext) -> BenchResult:
    result = BenchResult("levels", "one embed call served entirely by each level; the disk level against Redis")
    repeats = 5 if ctx.quick else 11
    details: dict = {"load_before": os.getloadavg()}
    skip = 0
    for batch in BATCHES:
        # Every computed vector written to L3 too (admission 'all'): each level is timed on its own here.
        cache = ctx.fresh_cache(disk=True, l3_admission="all")
        texts = ctx.unseen_texts(batch, skip=skip)
        skip += batch
        compute_repeats = 3 if batch == 32 else 1
        computed = []
        for _ in range(compute_repeats):
            new_texts = ctx.unseen_texts(batch, skip=skip)
            skip += batch
            started = time.perf_counter()
            served = cache.embed_detailed(new_texts).served
            computed.append(time.perf_counter() - started)
            assert served["compute"] == batch, served
        cache.embed(texts)
        cache.flush()
        timings = {"compute": median(computed)}
        for level in LEVEL_NAMES:
            samples = []
            for _ in range(repeats):
                cache.flush()  # the previous repeat's write-backs land first, then the upper levels are emptied
                _empty_above(cache, level)
                started = time.perf_counter()
                served = cache.embed_detailed(texts).served
                samples.append(time.perf_counter() - started)
                assert served[level] == batch, (level, served)
            timings[level] = median(samples)
        for level, seconds in timings.items():
            result.add(f"{batch} texts from {level}", seconds * 1000, "ms", note=f"{batch / seconds:,.0f} texts/s")
        for level in LEVEL_NAMES:
            result.add(f"{batch} texts: {level} / compute speed-up", timings["compute"] / timings[level], "x")
        details[batch] = {level: {"median_s": s, "texts_per_s": batch / s} for level, s in timings.items()}
        cache.close()
    details["disk"] = _disk_level(ctx, result)
    details["load_after"] = os.getloadavg()
    result.details = details
    return result


def _empty_above(cache, level: str) -> None:
    """Empty every level above ``level`` (by name), so that ``level`` serves the next call."""
    for name in LEVEL_NAMES[: LEVEL_NAMES.index(level)]:
        tier = cache.tiers[cache.levels.position_of(name)]
        if name == "L2":
            tier.client.flushdb()
        elif name == "disk":
            tier.store.clear()
        else:
            tier.clear()


def _disk_level(ctx: BenchContext, result: BenchResult) -> dict:
    from ragcache.storage.disk_store import DiskStore
    from ragcache.tiers.disk import DiskTier
    from ragcache.tiers.redis import RedisTier

    dim, calls = ctx.encoder.dim, 300 if ctx.quick else 2000
    keys = [f"rc:benchdisk:{time.time_ns()}:{i:032d}" for i in range(32)]
    vectors = torch.randn(32, dim)
    redis_pid = ctx._redis.process.pid if ctx._redis is not None else None
    with tempfile.TemporaryDirectory() as folder:
        store = DiskStore(Path(folder) / "disk", capacity_bytes=256 << 20)
        disk = DiskTier(store, dim=dim, dtype=torch.float32)
        l2 = RedisTier(ctx.redis_client, dim=dim, dtype=torch.float32)
        figures = {}
        for name, tier, server in (("disk", disk, None), ("L2", l2, redis_pid)):
            cpu = lambda server=server: time.process_time() + (process_tree_cpu_s(server) if server else 0.0)  # noqa: E731
            before = cpu()
            for _ in range(calls):
                tier.put_many(keys, vectors)
            written = cpu()
            for _ in range(calls):
                assert len(tier.get_many(keys).index) == 32
            figures[name] = {"write_ms_per_call": 1000 * (written - before) / calls, "read_ms_per_call": 1000 * (cpu() - written) / calls}
        store.close()
        bound = _bound_under_a_storm(Path(folder) / "storm", dim)
        restart = _restart(ctx, Path(folder) / "restart")
    read_ratio = figures["disk"]["read_ms_per_call"] / figures["L2"]["read_ms_per_call"]
    write_ratio = figures["disk"]["write_ms_per_call"] / figures["L2"]["write_ms_per_call"]
    result.add("disk: CPU to read 32 keys / Redis MGET of the same 32", read_ratio, "x", target=Target("<=", 0.5), goal="28.4",
               note=f"{figures['disk']['read_ms_per_call']:.4f} vs {figures['L2']['read_ms_per_call']:.4f} ms a call "
                    "(Redis: client + server)")
    result.add("disk: CPU to write 32 keys / Redis' write of them", write_ratio, "x", target=Target("<=", 1.0), goal="28.4",
               note=f"{figures['disk']['write_ms_per_call']:.4f} vs {figures['L2']['write_ms_per_call']:.4f} ms a call")
    result.add("disk: bytes on disk after writing 5x the budget / (budget + one generation)", bound["ratio"], "x",
               target=Target("<=", 1.0), goal="28.4",
               note=f"{bound['bytes_on_disk']:,} B on disk, budget {bound['budget']:,} B, {bound['num_rotations']} rotations, "
                    f"{bound['num_evicted']:,} entries evicted, {bound['bytes_per_entry']:.0f} B an entry")
    result.add("disk: texts written before a restart served from disk after it", restart["served_by_disk"] / restart["texts"], "x",
               target=Target(">=", 1.0), goal="28.4", note=f"{restart['served_by_disk']} of {restart['texts']}")
    return {"cpu": figures, "bound": bound, "restart": restart}


def _bound_under_a_storm(folder: Path, dim: int) -> dict:
    from ragcache.storage.disk_store import DiskStore
    from ragcache.tiers.disk import DiskTier

    budget, generations = 16 << 20, 4
    store = DiskStore(folder, capacity_bytes=budget, num_generations=generations)
    tier = DiskTier(store, dim=dim, dtype=torch.float32)
    value_bytes = 16 + 4 * dim
    num_texts = 5 * budget // value_bytes
    for start in range(0, num_texts, 256):
        tier.put_many([f"rc:storm:{i:032d}" for i in range(start, start + 256)], torch.randn(256, dim))
    figures = store.figures()
    on_disk = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    live = figures.used_bytes
    entries = num_texts - figures.num_evicted
    store.close()
    return {"budget": budget, "bytes_on_disk": on_disk, "ratio": on_disk / (budget + budget // generations),
            "num_rotations": figures.num_rotations, "num_evicted": figures.num_evicted, "bytes_per_entry": live / max(entries, 1)}


def _restart(ctx: BenchContext, folder: Path) -> dict:
    """Texts embedded through a cache with a disk level, the cache closed, a new one on the same folder: where
    the same texts come from (L2 and L3 off, so only the disk level can hold them)."""
    texts = ctx.unseen_texts(32, skip=10_000)
    settings = ctx.settings.replace(disk_path=str(folder), redis_url="off", milvus_uri="off")
    from ragcache import Stores, build_cache

    for round_ in range(2):
        stores = Stores.open(settings)
        cache = build_cache(settings, stores, ctx.encoder, on_close=stores.close)
        served = cache.embed_detailed(texts).served
        cache.close()
        if round_ == 0:
            assert served["compute"] == len(texts), served
    return {"texts": len(texts), "served_by_disk": served.get("disk", 0)}
