"""``bench levels``: what one ``embed`` call costs when every text comes from one level, per level.

For batches of 32 and 1,000 texts: served entirely by L1, by L2 (L1 emptied), by L3 (L1 and Redis emptied),
and computed (texts no level holds). Reports the median latency and the texts/s it implies, and each level's
speed-up over computing.
"""

from __future__ import annotations

import time
from statistics import median

from ragcache_bench.context import BenchContext
from ragcache_bench.report import BenchResult

BATCHES = (32, 1000)


def bench_levels(ctx: BenchContext) -> BenchResult:
    result = BenchResult("levels", "one embed call served entirely by each level")
    repeats = 5 if ctx.quick else 11
    details: dict = {}
    skip = 0
    for batch in BATCHES:
        cache = ctx.fresh_cache()
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
        emptied_above = {
            "L1": lambda: None,
            "L2": cache.tiers[0].clear,
            "L3": lambda: (cache.tiers[0].clear(), cache.tiers[1].client.flushdb()),  # noqa: B023 - called within this iteration
        }
        timings = {"compute": median(computed)}
        for level, empty in emptied_above.items():
            samples = []
            for _ in range(repeats):
                cache.flush()  # the previous repeat's write-backs land first, then the upper levels are emptied
                empty()
                started = time.perf_counter()
                served = cache.embed_detailed(texts).served
                samples.append(time.perf_counter() - started)
                assert served[level] == batch, (level, served)
            timings[level] = median(samples)
        for level, seconds in timings.items():
            result.add(f"{batch} texts from {level}", seconds * 1000, "ms", note=f"{batch / seconds:,.0f} texts/s")
        for level in ("L1", "L2", "L3"):
            result.add(f"{batch} texts: {level} / compute speed-up", timings["compute"] / timings[level], "x")
        details[batch] = {level: {"median_s": s, "texts_per_s": batch / s} for level, s in timings.items()}
        cache.close()
    result.details = details
    return result
