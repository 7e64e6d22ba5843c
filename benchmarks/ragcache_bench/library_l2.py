"""``bench l2`` (target 3): keys resident in L2, fetched by one ``embed`` call, against the MGET floor, a plain
dict, LangChain and RedisVL."""

from __future__ import annotations

import numpy as np
import torch

from ragcache_bench.context import BenchContext
from ragcache_bench.report import BenchResult, Target, interleaved, median
from ragcache_bench.systems import PEER_MODEL_NAME, CountingModel, DictFloor, LangChainCache, RedisFloor, RedisVLCache

__all__ = ["bench_l2"]


def _max_error(vectors, expected: np.ndarray) -> float:
    return float(np.abs(np.asarray(vectors, dtype=np.float32) - expected).max()) if len(expected) else 0.0


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
    redisvl = RedisVLCache(redisvl_model, ctx.redis_url, PEER_MODEL_NAME)
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
