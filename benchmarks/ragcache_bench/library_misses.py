"""``bench misses`` (target 4) and ``bench concurrency`` (target 6): texts no level holds, one request at a time
against the bare model, and many at once (single flight, shared model batches)."""

from __future__ import annotations

import threading
import time

import numpy as np

from ragcache_bench.context import BATCH_SIZE, BenchContext, CountingEncoder
from ragcache_bench.report import BenchResult, Target, median
from ragcache_bench.systems import BareModel

__all__ = ["bench_concurrency", "bench_misses"]


def bench_misses(ctx: BenchContext) -> BenchResult:
    """Every text new to every level: the cache's texts/s against the bare model's, same requests of 32.

    Pairs, side by side: each request of 32 new texts goes to the bare model and to the cache (which has
    never seen it), in alternating order; the cache's time includes waiting for its write-behind to L2/L3,
    so no background work spills into the bare model's next timing. The ratio is the median of per-pair
    ratios, which cancels both the drift of a shared machine and the differing lengths of the texts."""
    result = BenchResult("misses", "all misses: cache layer vs bare model, requests of 32")
    num_batches = 8 if ctx.quick else 24
    texts = ctx.unseen_texts(num_batches * BATCH_SIZE)
    batches = [texts[i : i + BATCH_SIZE] for i in range(0, len(texts), BATCH_SIZE)]
    bare = BareModel(ctx.model)
    cache = ctx.fresh_cache()  # L1 -> L2 -> L3 -> model, write-behind on: the default stack
    warm = ctx.unseen_texts(BATCH_SIZE, skip=len(texts))
    bare.embed(warm)
    cache.embed(warm)  # first use creates and loads the L3 collection: not a per-request cost
    cache.flush()

    bare_s: list[float] = []
    cache_s: list[float] = []
    computed = 0
    for index, batch in enumerate(batches):
        def run_cache(batch=batch):
            nonlocal computed
            computed += cache.embed_detailed(batch).served["compute"]
            cache.flush()

        order = [("bare", lambda batch=batch: bare.embed(batch)), ("cache", run_cache)]
        for name, fn in order if index % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            fn()
            (bare_s if name == "bare" else cache_s).append(time.perf_counter() - started)
    ratios = [b / c for b, c in zip(bare_s, cache_s)]
    bare_rate = len(texts) / sum(bare_s)
    cache_rate = len(texts) / sum(cache_s)
    result.add("bare model", bare_rate, "texts/s", note=f"{len(texts)} new texts in requests of {BATCH_SIZE}")
    result.add("ragcache, all misses (L1+L2+L3 missed)", cache_rate, "texts/s", note=f"{computed} of {len(texts)} computed")
    result.add("ragcache / bare model (median of pairs)", median(ratios), "x", target=Target(">=", 0.9), goal="4",
               note=f"pairs range {min(ratios):.2f}..{max(ratios):.2f}; ratio of totals {cache_rate / bare_rate:.3f}",
               requires={"every text computed": computed == len(texts)})
    levels = cache.stats().levels
    result.details = {
        "num_texts": len(texts),
        "bare_s": bare_s,
        "cache_s": cache_s,
        "pair_ratios": ratios,
        "cache_level_latency_p50_ms": {lvl.level: lvl.latency_p50_ms for lvl in levels},
    }
    cache.close()
    return result


def _concurrently(num_threads: int, fn) -> list:
    barrier = threading.Barrier(num_threads)
    results: list = [None] * num_threads

    def worker(index: int) -> None:
        barrier.wait()
        results[index] = fn(index)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def bench_concurrency(ctx: BenchContext) -> BenchResult:
    """64 concurrent requests for one uncached text; then 64 concurrent requests for 64 different ones."""
    result = BenchResult("concurrency", "64 concurrent callers (threads, one cache)")
    # Counted where the cache hands texts to the model, before the model's own de-duplication: one text
    # handed over 64 times and de-duplicated inside the model would still be 64 here.
    encoder = CountingEncoder(ctx.encoder)
    cache = ctx.fresh_cache(encoder=encoder)
    fresh = ctx.unseen_texts(65, skip=2000)
    vectors = _concurrently(64, lambda i: cache.embed([fresh[0]]))
    computed = len(encoder.texts_handed)
    identical = all(np.array_equal(v, vectors[0]) for v in vectors)
    result.add("texts handed to the model, 64 requests for one new text", computed, target=Target("==", 1), goal="6",
               note="counted before the model's own de-duplication", requires={"all 64 answers identical": identical})

    num_before = len(encoder.batch_sizes)
    _concurrently(64, lambda i: cache.embed([fresh[1 + i]]))
    sizes = encoder.batch_sizes[num_before:]
    num_calls = len(sizes)
    result.add("model calls for 64 concurrent distinct misses", num_calls, note=f"batch sizes seen by the model: {sizes}")
    result.add("largest model batch", max(sizes) if sizes else 0, target=Target(">=", 2), goal="6",
               note="misses from concurrent requests share a model batch (max batch = compute_batch_size)",
               requires={"each of the 64 texts handed over once": sum(sizes) == 64})
    result.details = {"same_text": {"computed": computed, "identical": identical},
                      "distinct": {"model_calls": num_calls, "batch_sizes": sizes}}
    cache.close()
    return result
