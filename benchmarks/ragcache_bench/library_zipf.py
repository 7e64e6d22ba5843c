"""``bench zipf`` (target 5): every system on the same Zipf stream side by side, and hit rates against the ideal
and against an exact LRU of the same size (L1 a tenth of the distinct texts; L2 under Redis ``maxmemory``)."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Any

import torch

from ragcache_bench.context import BATCH_SIZE, BenchContext, RecordingEncoder
from ragcache_bench.report import BenchResult, Target, median
from ragcache_bench.systems import PEER_MODEL_NAME, BareModel, CountingModel, LangChainCache, RedisVLCache

__all__ = ["bench_zipf", "simulate_exact_lru"]

MAX_LRU_GAP = 0.02  # hit rate: exact LRU minus Redis under maxmemory


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
        "RedisVL": RedisVLCache(computed["RedisVL"], ctx.redis_url, PEER_MODEL_NAME).embed,
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
