"""Benchmarks of ragcache as a library, each against the systems it must beat, measured in one process.

Each function takes the shared ``BenchContext`` and returns a ``BenchResult``; the figures that answer the
issue's targets carry that target and its number (``goal``).
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
import xxhash

from ragcache_bench.context import BATCH_SIZE, BenchContext, CountingEncoder, RecordingEncoder
from ragcache_bench.report import BenchResult, Target, interleaved, median
from ragcache_bench.systems import BareModel, CountingModel, DictFloor, LangChainCache, RedisFloor, RedisVLCache

__all__ = ["bench_l2", "bench_misses", "bench_zipf", "bench_concurrency", "bench_scale"]

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MAX_LRU_GAP = 0.02  # hit rate: exact LRU minus Redis under maxmemory


def _max_error(vectors, expected: np.ndarray) -> float:
    return float(np.abs(np.asarray(vectors, dtype=np.float32) - expected).max()) if len(expected) else 0.0


# ---- target 3: keys resident in L2 ------------------------------------------------------------------------


def bench_l2(ctx: BenchContext) -> BenchResult:
    """1,000 keys resident in L2, fetched by one ``embed`` call, against the floor and two other caches."""
    result = BenchResult("l2", f"{ctx.sizes.l2_keys:,} keys resident in L2, one call")
    texts = ctx.distinct_stream_texts()[: ctx.sizes.l2_keys]
    expected = ctx.vectors(texts)
    space = ctx.encoder.space
    keys = space.keys(texts)

    cache = ctx.fresh_cache()
    l1, l2 = cache.tiers[0], cache.tiers[1]
    l2.put_many(keys, torch.from_numpy(expected))
    # Each other cache over its own counting view of the model: a text it computed was a miss, not a fetch.
    langchain_model, redisvl_model = CountingModel(ctx.model), CountingModel(ctx.model)
    langchain = LangChainCache(langchain_model, ctx.redis_url, namespace=space.space_id)
    langchain.seed(texts, expected)
    redisvl = RedisVLCache(redisvl_model, ctx.redis_url, MODEL_NAME)
    redisvl.seed(texts, expected)
    # Counted from here: RedisVL's vectorizer encodes one probe text ("dimension check") when it is built.
    langchain_model.num_texts = redisvl_model.num_texts = 0
    floor = RedisFloor(ctx.redis_url, space.dim)
    plain = DictFloor()
    plain.seed(keys, expected)

    served = cache.embed_detailed(texts).served
    l1.clear()
    checks = {
        "ragcache": _max_error(cache.embed(texts), expected),
        "floor": _max_error(floor.fetch(keys), expected),
        "langchain": _max_error(langchain.embed(texts), expected),
        "redisvl": _max_error(redisvl.embed(texts), expected),
    }
    l1.clear()
    samples = interleaved(
        {
            "ragcache": lambda: cache.embed(texts),
            "floor": lambda: floor.fetch(keys),
            "dict": lambda: plain.fetch(keys),
            "langchain": lambda: langchain.embed(texts),
            "redisvl": lambda: redisvl.embed(texts),
        },
        repeats=max(ctx.sizes.repeats * 3, 15),
        warmup=2,
        # Every ragcache call must find L1 empty, or it would be an L1 benchmark.
        before={"ragcache": l1.clear},
    )
    rate = {name: len(keys) / median(values) for name, values in samples.items()}
    result.add("ragcache embed, all from L2", rate["ragcache"], "keys/s", note=f"served {served}")
    result.add("floor: one MGET + np.frombuffer", rate["floor"], "keys/s")
    result.add("plain dict + np.stack", rate["dict"], "keys/s", note="in-process, no Redis")
    result.add("LangChain CacheBackedEmbeddings", rate["langchain"], "keys/s")
    result.add("RedisVL EmbeddingsCache", rate["redisvl"], "keys/s")
    result.add("ragcache / floor", rate["ragcache"] / rate["floor"], "x", target=Target(">=", 0.8), goal="3",
               note="target raised from 0.6x to 0.8x by issue 14 (target 6)")
    result.add("ragcache / LangChain", rate["ragcache"] / rate["langchain"], "x", target=Target(">=", 5), goal="3",
               note=f"LangChain computed {langchain_model.num_texts} texts",
               requires={"every LangChain call hit its cache": langchain_model.num_texts == 0})
    result.add("ragcache / RedisVL", rate["ragcache"] / rate["redisvl"], "x", target=Target(">=", 5), goal="3",
               note=f"RedisVL computed {redisvl_model.num_texts} texts",
               requires={"every RedisVL call hit its cache": redisvl_model.num_texts == 0})
    result.details = {
        "num_keys": len(keys),
        "median_ms": {name: median(values) * 1000 for name, values in samples.items()},
        "samples_ms": {name: [v * 1000 for v in values] for name, values in samples.items()},
        "max_abs_error_vs_model": checks,
        "served_first_call": served,
        "texts_computed": {"langchain": langchain_model.num_texts, "redisvl": redisvl_model.num_texts},
        "notes": "ragcache hashes the texts and builds keys inside the call; the floor is given ready keys. "
        "ragcache also checks each value's header and checksum and copies the vectors into L1.",
    }
    cache.close()
    langchain.close()
    redisvl.close()
    floor.close()
    return result


# ---- target 4: all misses --------------------------------------------------------------------------------


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


# ---- target 5 and the stream race ---------------------------------------------------------------------------


def _run_stream(embed, ctx: BenchContext, num_batches: int) -> tuple[float, list[float]]:
    latencies = []
    started = time.perf_counter()
    for index in range(num_batches):
        t0 = time.perf_counter()
        embed(ctx.batch(index))
        latencies.append(time.perf_counter() - t0)
    return time.perf_counter() - started, latencies


def bench_zipf(ctx: BenchContext) -> BenchResult:
    """The Zipf stream: every system on the same prefix; hit rates against the ideal over the whole stream."""
    stream = ctx.stream
    result = BenchResult("zipf", f"Zipf(s=1.1) stream over {len(ctx.corpus):,} passages, requests of 32")
    race = _race(ctx, result)
    hit_rates = _hit_rates(ctx, result)
    result.details = {
        "corpus_passages": len(ctx.corpus),
        "corpus_digest": ctx.corpus.digest,
        "stream": {"batches": len(stream.batches), "texts": stream.num_texts, "distinct": stream.num_distinct, "seed": stream.seed},
        "race": race,
        "hit_rates": hit_rates,
    }
    return result


def _race(ctx: BenchContext, result: BenchResult) -> dict:
    """Every system on the same stream prefix, request by request: request i goes to each system in turn
    (the order rotating), so all of them run under the same background load. Each cache starts empty."""
    num_batches = ctx.sizes.race_batches
    prefix = [ctx.batch(i) for i in range(num_batches)]
    num_texts = sum(len(b) for b in prefix)
    distinct = len({t for b in prefix for t in b})
    space_id = ctx.encoder.space.space_id
    ctx.redis_client.flushdb()
    cache = ctx.fresh_cache()
    # What each cache computed, so the second pass can be checked to be all hits everywhere.
    computed = {"LangChain": CountingModel(ctx.model), "RedisVL": CountingModel(ctx.model)}
    ragcache_computed = [0]

    def ragcache_embed(texts):
        ragcache_computed[0] += cache.embed_detailed(texts).served.get("compute", 0)
        cache.flush()  # its write-behind must not spill into the next system's timing

    systems = {
        "no cache": BareModel(ctx.model).embed,
        "LangChain": LangChainCache(computed["LangChain"], ctx.redis_url, namespace=space_id).embed,
        "RedisVL": RedisVLCache(computed["RedisVL"], ctx.redis_url, MODEL_NAME).embed,
        "ragcache": ragcache_embed,
    }
    names = list(systems)
    BareModel(ctx.model).embed(ctx.unseen_texts(BATCH_SIZE, skip=3000))  # warm the model
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for index, batch in enumerate(prefix):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            systems[name](batch)
            seconds[name].append(time.perf_counter() - started)
    # The same requests again: every text is now cached in every cache, so only serving differs.
    first_pass = {"ragcache": ragcache_computed[0]} | {name: model.num_texts for name, model in computed.items()}
    warm: dict[str, list[float]] = {name: [] for name in names if name != "no cache"}
    for index, batch in enumerate(prefix):
        shift = index % len(warm)
        for name in list(warm)[shift:] + list(warm)[:shift]:
            started = time.perf_counter()
            systems[name](batch)
            warm[name].append(time.perf_counter() - started)
    cache.close()
    second_computed = {"ragcache": ragcache_computed[0] - first_pass["ragcache"]} | {
        name: model.num_texts - first_pass[name] for name, model in computed.items()}
    race: dict[str, Any] = {"second_pass_computed": second_computed,
                            "prefix_batches": num_batches, "texts": num_texts, "distinct": distinct, "systems": {
        name: {"texts_per_s": num_texts / sum(values), "p50_ms": median(values) * 1000, "seconds": values}
        for name, values in seconds.items()},
        "second_pass": {name: {"texts_per_s": num_texts / sum(values), "p50_ms": median(values) * 1000}
                        for name, values in warm.items()}}
    for name, figures in race["systems"].items():
        result.add(f"stream race: {name}", figures["texts_per_s"], "texts/s", note=f"p50 {figures['p50_ms']:.1f} ms/request")
    rates = {name: figures["texts_per_s"] for name, figures in race["systems"].items()}
    result.add("stream race: ragcache / no cache", rates["ragcache"] / rates["no cache"], "x",
               note=f"first {num_batches} requests: {num_texts} texts, {distinct} distinct; each cache computes each distinct text")
    result.add("stream race: ragcache / best other cache", rates["ragcache"] / max(rates["LangChain"], rates["RedisVL"]), "x",
               note="a cold stream is dominated by computing its distinct texts, the same work for every cache")
    second = {name: figures["texts_per_s"] for name, figures in race["second_pass"].items()}
    for name, rate in second.items():
        result.add(f"second pass (all cached): {name}", rate, "texts/s", note=f"p50 {race['second_pass'][name]['p50_ms']:.2f} ms/request")
    result.add("second pass: ragcache / no cache", second["ragcache"] / rates["no cache"], "x")
    result.add("second pass: ragcache / best other cache", second["ragcache"] / max(second["LangChain"], second["RedisVL"]), "x",
               target=Target(">=", 1.0), note="texts computed in the second pass: "
               + ", ".join(f"{name} {count}" for name, count in second_computed.items()),
               requires={f"{name} all hits": count == 0 for name, count in second_computed.items()})
    return race


def _replay(ctx: BenchContext, cache) -> dict[str, int]:
    served = dict.fromkeys(cache.level_names, 0)
    for index in range(len(ctx.stream.batches)):
        for level, count in cache.embed_detailed(ctx.batch(index)).served.items():
            served[level] += count
    cache.flush()
    return served


def _hit_rates(ctx: BenchContext, result: BenchResult) -> dict:
    stream = ctx.stream
    ideal = stream.ideal_hit_rate
    # Ample capacity: the default 256 MiB L1 holds ~170k vectors, far more than the stream's distinct texts.
    encoder = RecordingEncoder(ctx)
    cache = ctx.fresh_cache(encoder=encoder)
    served = _replay(ctx, cache)
    measured = cache.stats().hit_rate
    # Informational: with room for everything, ideal is what any cache that computes each text once gets.
    result.add("hit rate, capacity suffices", measured,
               note=f"ideal 1 - {stream.num_distinct}/{stream.num_texts} = {ideal:.4f}; model computed {encoder.num_texts}",
               requires={"each distinct text computed once": encoder.num_texts == stream.num_distinct})
    ample = {"ideal": ideal, "measured": measured, "texts_computed": encoder.num_texts, "served": served}
    cache.close()

    # L1 holds a tenth of the distinct texts; L2 and L3 start empty and hold everything.
    row_bytes = ctx.encoder.dim * 4
    l1_rows = math.ceil(stream.num_distinct / 10)
    encoder = RecordingEncoder(ctx)
    cache = ctx.fresh_cache(encoder=encoder, l1_bytes=l1_rows * row_bytes)
    served = _replay(ctx, cache)
    stats = cache.stats()
    per_level = {lvl.level: {"hits": lvl.hits, "lookups": lvl.lookups, "hit_rate": lvl.hit_rate} for lvl in stats.levels}
    for name, count in served.items():
        conditional = f"; {per_level[name]['hit_rate']:.1%} of its lookups" if name in per_level else ""
        result.add(f"L1 = 10% of distinct: served by {name}", count / stream.num_texts, note=f"{count} texts{conditional}")
    result.add("L1 = 10% of distinct: overall hit rate", stats.hit_rate, note=f"ideal {ideal:.4f}; L1 holds {l1_rows} vectors")
    # The verdict that can fail: L1 is an exact LRU, so what it served must equal, to the text, what an exact
    # LRU of the same number of rows serves on the same stream (simulated with the walk's order of writes).
    expected_l1 = simulate_exact_lru(stream.batches, l1_rows)
    result.add("L1 = 10% of distinct: served by L1 / exact LRU", served["L1"] / expected_l1 if expected_l1 else float("nan"),
               "x", target=Target("==", 1.0), goal="5", note=f"exact LRU of {l1_rows} rows serves {expected_l1} texts")
    small = {"l1_rows": l1_rows, "served": served, "per_level": per_level, "hit_rate": stats.hit_rate,
             "texts_computed": encoder.num_texts, "exact_lru_l1_served": expected_l1}
    cache.close()
    return {"ample": ample, "l1_tenth": small, "l2_evicting": _redis_evicting(ctx, result)}


def simulate_exact_lru(batches, capacity: int) -> int:
    """Inputs an exact LRU of ``capacity`` entries serves as L1 of the walk, over requests of item ids.

    Per request, as ``EmbeddingCache.embed_detailed`` does: distinct ids looked up in order (a hit becomes
    most recent), then the misses written in the order lower levels answer them — ids seen before (found in
    L2, which holds everything here) first, then ids never seen (computed). Duplicates in a request count
    once per input, all served by the level of their first occurrence."""
    lru: OrderedDict[int, None] = OrderedDict()
    seen: set[int] = set()
    served = 0
    for batch in batches:
        ids = [int(i) for i in batch]
        counts: dict[int, int] = {}
        for item in ids:
            counts[item] = counts.get(item, 0) + 1
        missed = []
        for item in counts:
            if item in lru:
                lru.move_to_end(item)
                served += counts[item]
            else:
                missed.append(item)
        for item in [i for i in missed if i in seen] + [i for i in missed if i not in seen]:
            lru[item] = None
            lru.move_to_end(item)
            if len(lru) > capacity:
                lru.popitem(last=False)
        seen.update(missed)
    return served


def _redis_evicting(ctx: BenchContext, result: BenchResult) -> dict:
    """L2 alone under a Redis ``maxmemory`` that holds about half the distinct vectors (allkeys-lru): the
    hit rate Redis' sampled LRU reaches against the ideal (never forgets) and an exact LRU of the same size."""
    stream = ctx.stream
    client = ctx.redis_client
    encoder = RecordingEncoder(ctx)
    # L1 of one row: nearly every lookup reaches L2, which is what is measured here.
    cache = ctx.fresh_cache(encoder=encoder, l1_bytes=ctx.encoder.dim * 4, l3=False)
    client.flushdb()
    per_entry = _redis_bytes_per_entry(ctx, cache)
    client.flushdb()
    entries = stream.num_distinct // 2
    baseline = client.info("memory")["used_memory"]
    old = client.config_get("maxmemory*")
    try:
        client.config_set("maxmemory", baseline + entries * per_entry)
        client.config_set("maxmemory-policy", "allkeys-lru")
        served = _replay(ctx, cache)
        evicted = client.info("stats")["evicted_keys"]
    finally:
        client.config_set("maxmemory", old.get("maxmemory", "0"))
        client.config_set("maxmemory-policy", old.get("maxmemory-policy", "noeviction"))
        cache.close()
    measured = 1 - served["compute"] / stream.num_texts
    exact = (simulate_exact_lru(stream.batches, entries + 1)) / stream.num_texts
    result.add("L2 under maxmemory (~half of distinct): hit rate", measured,
               note=f"{evicted:,} keys evicted; ideal {stream.ideal_hit_rate:.4f}; exact LRU of {entries:,} entries {exact:.4f}",
               requires={"Redis evicted": evicted > 0})
    # The number that can fail: Redis' sampled LRU must stay within two points of an exact LRU of the same
    # size (runs so far: 0.001-0.006); a wrong policy (allkeys-random, volatile-*) or a size off by half is not.
    result.add("L2 under maxmemory: gap to exact LRU", exact - measured, target=Target("<=", MAX_LRU_GAP),
               note="Redis approximates LRU by sampling keys (maxmemory-samples); the gap is what that costs here",
               requires={"Redis evicted": evicted > 0})
    return {"entries": entries, "bytes_per_entry": per_entry, "hit_rate": measured, "exact_lru": exact,
            "ideal": stream.ideal_hit_rate, "evicted": evicted, "served": served}


def _redis_bytes_per_entry(ctx: BenchContext, cache) -> int:
    """Redis memory per cached vector, measured by storing 1,000 of them through the cache's own L2."""
    client = ctx.redis_client
    before = client.info("memory")["used_memory"]
    keys = ctx.encoder.space.keys([f"probe {i}" for i in range(1000)])
    cache.tiers[1].put_many(keys, torch.zeros(1000, ctx.encoder.dim))
    return max(1, (client.info("memory")["used_memory"] - before) // 1000)


# ---- target 6: concurrency ----------------------------------------------------------------------------------


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


# ---- target 7: lookup cost against size -------------------------------------------------------------------


def _synthetic_keys(space_id: str, start: int, stop: int) -> list[str]:
    digest = xxhash.xxh3_128_hexdigest
    return [f"rc:{space_id}:{digest(str(i).encode())}" for i in range(start, stop)]


def _lookup_cost(get_many, keys_at, size: int, rng: np.random.Generator, repeats: int, batch: int = BATCH_SIZE) -> float:
    """Median seconds of ``get_many`` of ``batch`` random resident keys (a new sample each call)."""
    samples = []
    for _ in range(repeats):
        keys = [keys_at(int(i)) for i in rng.integers(0, size, batch)]
        started = time.perf_counter()
        hits = get_many(keys)
        samples.append(time.perf_counter() - started)
        if len(hits.index) != len(set(keys)) and len(hits.index) != len(keys):
            raise RuntimeError(f"lookup at {size:,} entries missed {len(keys) - len(hits.index)} resident keys")
    return median(samples)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * 4096


def bench_scale(ctx: BenchContext) -> BenchResult:
    """Lookup cost of 32 random resident keys at 10k, 100k and 1M entries, per level; L1 memory vs budget."""
    from ragcache.tiers.memory import MemoryTier
    from ragcache.tiers.milvus import MilvusTier
    from ragcache.tiers.milvus_budget import WRITTEN_AT
    from ragcache.tiers.redis import RedisTier

    result = BenchResult("scale", "lookup of 32 random resident keys vs entries held")
    space = ctx.encoder.space
    dim, sizes = space.dim, ctx.sizes.scale_sizes
    rng = np.random.default_rng(ctx.seed)
    repeats = 300
    details: dict = {"sizes": list(sizes), "L1": {}, "L2": {}, "L3": {}}

    for size in sizes:
        # RSS first, and no list of a million keys before it: each chunk of keys is made as it is stored and then
        # dropped, so the growth is what the tier holds (slab and key map) plus one chunk's strings at most, not
        # the bench's own key list (sampled after that list was built, its heap growth hid the map: 7 B/entry
        # reported against the ~90 the map's arrays take by construction).
        rss_before = _rss_bytes()
        tier = MemoryTier(size * dim * 4, dim, torch.float32)
        for start in range(0, size, 50_000):
            chunk = _synthetic_keys(space.space_id, start, min(start + 50_000, size))
            tier.put_many(chunk, torch.randn(len(chunk), dim))
        del chunk
        rss = _rss_bytes() - rss_before
        keys = _synthetic_keys(space.space_id, 0, size)
        # Fresh key strings for every lookup, as the cache builds them (a stored key object would let the
        # dict compare by identity and skip reading the stored key).
        fresh_key = lambda i: _synthetic_keys(space.space_id, i, i + 1)[0]  # noqa: E731
        cost = _lookup_cost(tier.get_many, fresh_key, size, rng, repeats)
        plain = DictFloor()
        plain.seed(keys, np.zeros((size, dim), dtype=np.float32))
        dict_samples = []
        for _ in range(repeats):
            sample = [fresh_key(int(i)) for i in rng.integers(0, size, BATCH_SIZE)]
            started = time.perf_counter()
            plain.fetch(sample)
            dict_samples.append(time.perf_counter() - started)
        details["L1"][size] = {"lookup_us": cost * 1e6, "plain_dict_us": median(dict_samples) * 1e6,
                               "budget_bytes": tier.capacity_bytes, "slab_bytes": tier.slab_bytes,
                               "rss_growth_bytes": rss, "map_bytes_per_entry": (rss - tier.slab_bytes) / size}
        del tier, keys, plain
        gc.collect()
    l1 = details["L1"]
    for size in sizes:
        result.add(f"L1 lookup at {size:,}", l1[size]["lookup_us"], "us", note=f"plain dict + np.stack: {l1[size]['plain_dict_us']:.1f} us")
    result.add(f"L1 cost {sizes[-1]:,} / {sizes[0]:,}", l1[sizes[-1]]["lookup_us"] / l1[sizes[0]]["lookup_us"], "x",
               target=Target("<=", 1.5), goal="7",
               note=f"plain dict: {l1[sizes[-1]]['plain_dict_us'] / l1[sizes[0]]['plain_dict_us']:.2f}x over the same sizes")
    big = l1[sizes[-1]]
    # Measured, not derived: the process's resident memory grew by this much while the tier was filled, slab
    # and host key map together (plus at most one chunk's transient key strings: the figure errs high). The slab
    # alone is within budget by construction.
    result.add(f"L1 memory at {sizes[-1]:,}: RSS growth / budget", big["rss_growth_bytes"] / big["budget_bytes"], "x",
               target=Target("<=", 1.1), goal="7",
               note=f"budget {big['budget_bytes'] / 2**20:,.0f} MiB; {big['rss_growth_bytes'] / sizes[-1]:,.0f} B/entry measured, "
               f"of which the host key map {big['map_bytes_per_entry']:.0f} B/entry (outside the slab budget)")

    redis_tier = RedisTier(ctx.redis_client, dim=dim, dtype=torch.float32, ttl_s=None)
    ctx.redis_client.flushdb()
    filled = 0
    for size in sizes:
        keys_fill = _synthetic_keys(space.space_id, filled, size)
        for start in range(0, len(keys_fill), 10_000):
            chunk = keys_fill[start : start + 10_000]
            redis_tier.put_many(chunk, torch.randn(len(chunk), dim))
        filled = size
        cost = _lookup_cost(redis_tier.get_many, lambda i: _synthetic_keys(space.space_id, i, i + 1)[0], size, rng, repeats)
        details["L2"][size] = {"lookup_us": cost * 1e6, "redis_used_memory": ctx.redis_client.info("memory")["used_memory"]}
        result.add(f"L2 lookup at {size:,}", cost * 1e6, "us")
    ctx.redis_client.flushdb()

    l3_sizes = ctx.sizes.l3_scale_sizes
    ctx.milvus.drop_collection(f"rc_{space.space_id}")
    milvus_tier = MilvusTier(ctx.milvus, space_id=space.space_id, dim=dim, dtype=torch.float32)
    filled = 0
    for size in l3_sizes:
        started = time.perf_counter()
        keys_fill = _synthetic_keys(space.space_id, filled, size)
        milvus_tier._ensure_collection()
        for start in range(0, len(keys_fill), 2_000):
            # A plain insert of new keys (the fill is set-up, not what is measured), 2,000 rows at a time:
            # Milvus Lite 2.5 takes 5,000+ rows per call ~30x slower per row (measured: ~150 vs ~4,700 rows/s).
            chunk = keys_fill[start : start + 2_000]
            rows = torch.randn(len(chunk), dim).numpy()
            ctx.milvus.insert(milvus_tier.collection, [{"key": k[-32:], "vector": v, WRITTEN_AT: 0} for k, v in zip(chunk, rows)])
        fill_rate = (size - filled) / (time.perf_counter() - started)
        filled = size
        cost = _lookup_cost(milvus_tier.get_many, lambda i: _synthetic_keys(space.space_id, i, i + 1)[0], size, rng, 30)
        details["L3"][size] = {"lookup_us": cost * 1e6, "insert_rows_per_s": fill_rate}
        result.add(f"L3 lookup at {size:,}", cost * 1e6, "us", note=f"inserted at {fill_rate:,.0f} rows/s")
    if l3_sizes[-1] < sizes[-1]:
        result.add(f"L3 at {sizes[-1]:,}", "not run", note="--quick: Milvus Lite inserts ~4k rows/s; the full run measures it")
    ctx.milvus.drop_collection(f"rc_{space.space_id}")
    result.details = details
    return result
