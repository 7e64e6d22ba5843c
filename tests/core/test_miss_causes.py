"""Every miss explained (ragcache.core.causes): each cause produced by a scenario of its own on real levels (L1
slabs, the disk level on real LMDB, a real Redis), and counted exactly once, at the level that missed."""

from __future__ import annotations

import time

import redis
import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.stats import MISS_CAUSES
from ragcache.errors import TierUnavailableError
from ragcache.storage.disk_store import DiskStore
from ragcache.tiers import DiskTier, MemoryTier, RedisTier
from tests.fakes import HashEncoder

DIM = 8


def memory(rows: int, name: str = "L1") -> MemoryTier:
    tier = MemoryTier(rows * DIM * 4, DIM, torch.float32)
    tier.name = name
    return tier


def causes(cache: EmbeddingCache) -> dict[str, dict[str, int]]:
    """Per level, only the causes that counted anything."""
    return {level.level: {cause: n for cause, n in level.misses_by_cause.items() if n} for level in cache.stats().levels}


class Down:
    """A level that refuses every call (fault injection through the constructor)."""

    name = "L2"

    def get_many(self, keys):
        raise TierUnavailableError("L2", "connection refused")

    put_many = get_many

    def close(self):
        pass


def test_misses_of_texts_never_seen_and_l1_hits_explain_nothing():
    with EmbeddingCache(HashEncoder(DIM), [memory(100)], write_behind=False) as cache:
        cache.embed(["a", "b"])
        cache.embed(["a", "b"])  # L1 hits: no miss
        assert causes(cache) == {"L1": {"never_seen": 2}}
        assert set(cache.stats().levels[0].misses_by_cause) == set(MISS_CAUSES)


def test_a_text_dropped_for_room_is_evicted_and_served_by_the_disk_level(tmp_path):
    store = DiskStore(tmp_path, capacity_bytes=4 << 20)
    try:
        tiers = [memory(2), DiskTier(store, dim=DIM, dtype=torch.float32)]
        with EmbeddingCache(HashEncoder(DIM), tiers, write_behind=False) as cache:
            cache.embed(["a", "b"])
            cache.embed(["c", "d"])  # L1 holds two rows: a and b go
            result = cache.embed_detailed(["a"])
            assert result.served["disk"] == 1
            assert causes(cache) == {"L1": {"never_seen": 4, "evicted": 1}, "disk": {"never_seen": 4}}
    finally:
        store.close()


def test_an_l2_entry_past_its_ttl_is_expired(redis_url):
    client = redis.Redis.from_url(redis_url)
    tiers = [memory(100), RedisTier(client, dim=DIM, dtype=torch.float32, ttl_s=1)]
    with EmbeddingCache(HashEncoder(DIM), tiers, write_behind=False) as cache:
        cache.embed(["short-lived"])
        tiers[0].clear()
        time.sleep(1.2)  # past the 1 s TTL: Redis dropped it
        cache.embed(["short-lived"])
        assert causes(cache) == {"L1": {"never_seen": 1, "evicted": 1}, "L2": {"never_seen": 1, "expired": 1}}


def test_a_text_seen_before_the_model_changed_is_drift():
    with EmbeddingCache(HashEncoder(DIM), [memory(100)], write_behind=False) as cache:
        cache.embed(["same text"])
        cache.generation.value += 1  # what the drift check does when the model behind the name changed
        cache.embed(["same text"])
        assert causes(cache) == {"L1": {"never_seen": 1, "drift": 1}}


def test_a_level_that_admits_on_reuse_only_was_bypassed_until_the_text_proved_reuse():
    l1, l2, l3 = memory(100), memory(100, "L2"), memory(100, "L3")
    with EmbeddingCache(HashEncoder(DIM), [l1, l2, l3], write_behind=False, admit_on_reuse=["L3"]) as cache:
        cache.embed(["once"])  # computed: L3 declines it
        l1.clear()
        l2.clear()
        assert cache.embed_detailed(["once"]).served["compute"] == 1
        assert causes(cache)["L3"] == {"never_seen": 1, "bypassed": 1}
        assert cache.level_states()["L3"]["num_declined"] == 2
        l1.clear()
        assert cache.embed_detailed(["once"]).served["L2"] == 1  # asked again after leaving L1: written down
        assert cache.level_states()["L3"]["num_admitted"] == 1
        l1.clear()
        l2.clear()
        assert cache.embed_detailed(["once"]).served["L3"] == 1


def test_a_level_that_fails_is_unavailable():
    with EmbeddingCache(HashEncoder(DIM), [memory(100), Down()], write_behind=False) as cache:
        cache.embed(["while L2 is down"])
        assert causes(cache) == {"L1": {"never_seen": 1}, "L2": {"unavailable": 1}}


def test_the_causes_are_prometheus_counters_per_level_and_cause():
    from ragcache.app.metrics import CacheCollector

    with EmbeddingCache(HashEncoder(DIM), [memory(100), Down()], write_behind=False) as cache:
        cache.embed(["one", "two"])
        samples = {(s.labels["level"], s.labels["cause"]): s.value for family in CacheCollector(lambda: [cache]).collect()
                   if family.name == "ragcache_misses_by_cause" for s in family.samples if s.name.endswith("_total")}
        assert samples[("L1", "never_seen")] == 2 and samples[("L2", "unavailable")] == 2
        assert samples[("L1", "evicted")] == 0 and len(samples) == 2 * 6
