"""Every miss explained (ragcache.core.causes): each cause produced by a scenario of its own on real levels (L1
slabs, the disk level on real LMDB, a real Redis, a real Milvus Lite; drift through the real drift check; the
levels the settings build), and counted exactly once, at the level that missed. A Redis that stops answering:
tests/scenarios/test_miss_causes_outage.py."""

from __future__ import annotations

import time
import uuid

import numpy as np
import redis
import torch

from ragcache.build import build_cache, drift_monitor
from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.core.stats import MISS_CAUSES
from ragcache.errors import TierUnavailableError
from ragcache.settings import Settings
from ragcache.storage.disk_store import DiskStore
from ragcache.storage.stores import Stores, open_milvus
from ragcache.tiers import DiskTier, MemoryTier, MilvusTier, RedisTier
from tests.fakes import HashEncoder, SwappableEncoder

DIM = 8


def memory(rows: int, name: str = "L1") -> MemoryTier:
    tier = MemoryTier(rows * DIM * 4, DIM, torch.float32)
    tier.name = name
    return tier


def causes(cache: EmbeddingCache) -> dict[str, dict[str, int]]:
    """Per level, only the causes that counted anything."""
    return {level.level: {cause: n for cause, n in level.misses_by_cause.items() if n} for level in cache.stats().levels}


class CountingMilvus:
    """A real Milvus client that counts the lookups (``get``) made through it; passed to ``MilvusTier``."""

    def __init__(self, client):
        self._client = client
        self.num_gets = 0

    def get(self, *args, **kwargs):
        self.num_gets += 1
        return self._client.get(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


def milvus(client, space_id: str, **options) -> MilvusTier:
    return MilvusTier(client, space_id=space_id, dim=DIM, dtype=torch.float32, **options)


class Down:
    """A level that refuses every call (fault injection through the constructor)."""

    name = "L2"

    def get_many(self, keys):
        raise TierUnavailableError("L2", "connection refused")

    put_many = get_many

    def close(self):
        pass


def test_misses_of_texts_never_seen_and_l1_hits_explain_nothing():
    with EmbeddingCache(HashEncoder(DIM), Levels([memory(100)], dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        cache.embed(["a", "b"])
        cache.embed(["a", "b"])  # L1 hits: no miss
        assert causes(cache) == {"L1": {"never_seen": 2}}
        assert set(cache.stats().levels[0].misses_by_cause) == set(MISS_CAUSES)


def test_a_text_dropped_for_room_is_evicted_and_served_by_the_disk_level(tmp_path):
    store = DiskStore(tmp_path, capacity_bytes=4 << 20)
    try:
        tiers = [memory(2), DiskTier(store, dim=DIM, dtype=torch.float32)]
        with EmbeddingCache(HashEncoder(DIM), Levels(tiers, dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
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
    with EmbeddingCache(HashEncoder(DIM), Levels(tiers, dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        cache.embed(["short-lived"])
        tiers[0].clear()
        time.sleep(1.2)  # past the 1 s TTL: Redis dropped it
        cache.embed(["short-lived"])
        assert causes(cache) == {"L1": {"never_seen": 1, "evicted": 1}, "L2": {"never_seen": 1, "expired": 1}}


def test_a_text_seen_before_the_model_changed_is_drift():
    with EmbeddingCache(HashEncoder(DIM), Levels([memory(100)], dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        cache.embed(["same text"])
        cache.generation.value += 1  # what the drift check does when the model behind the name changed
        cache.embed(["same text"])
        assert causes(cache) == {"L1": {"never_seen": 1, "drift": 1}}


def test_a_level_that_admits_on_reuse_only_was_bypassed_until_the_text_proved_reuse():
    l1, l2, l3 = memory(100), memory(100, "L2"), memory(100, "L3")
    levels = Levels([l1, l2, l3], dim=DIM, dtype=torch.float32, write_behind=False, admit_on_reuse=["L3"])
    with EmbeddingCache(HashEncoder(DIM), levels) as cache:
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
    with EmbeddingCache(HashEncoder(DIM), Levels([memory(100), Down()], dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        cache.embed(["while L2 is down"])
        assert causes(cache) == {"L1": {"never_seen": 1}, "L2": {"unavailable": 1}}


def test_the_causes_are_prometheus_counters_per_level_and_cause():
    from ragcache.app.metrics import CacheCollector

    with EmbeddingCache(HashEncoder(DIM), Levels([memory(100), Down()], dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        cache.embed(["one", "two"])
        samples = {(s.labels["level"], s.labels["cause"]): s.value for family in CacheCollector(lambda: [cache]).collect()
                   if family.name == "ragcache_misses_by_cause" for s in family.samples if s.name.endswith("_total")}
        assert samples[("L1", "never_seen")] == 2 and samples[("L2", "unavailable")] == 2
        assert samples[("L1", "evicted")] == 0 and len(samples) == 2 * 6


def test_an_empty_milvus_collection_is_not_asked_and_its_misses_are_bypassed_until_a_write(milvus_client):
    counting = CountingMilvus(milvus_client)
    l1 = memory(100)
    # A long recheck: only the cache's own write can turn the level on within this test.
    l3 = milvus(counting, uuid.uuid4().hex[:16], empty_recheck_s=3600)
    with EmbeddingCache(HashEncoder(DIM), Levels([l1, l3], dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        assert cache.embed_detailed(["a", "b"]).served == {"L1": 0, "L3": 0, "compute": 2}
        assert counting.num_gets == 0  # not asked: its row count said empty
        assert causes(cache) == {"L1": {"never_seen": 2}, "L3": {"bypassed": 2}}
        assert l3.count() == 2  # the computed vectors were written down: from now on it is asked
        l1.clear()
        assert cache.embed_detailed(["a", "b", "c"]).served == {"L1": 0, "L3": 2, "compute": 1}
        assert counting.num_gets == 1
        assert causes(cache) == {"L1": {"never_seen": 3, "evicted": 2}, "L3": {"bypassed": 2, "never_seen": 1}}


def test_rows_another_process_wrote_are_found_at_the_next_recount_and_not_before(milvus_client):
    space_id = uuid.uuid4().hex[:16]
    counting = CountingMilvus(milvus_client)
    l3 = milvus(counting, space_id, empty_recheck_s=0)  # the row count read again before every lookup
    patient = milvus(milvus_client, space_id, empty_recheck_s=3600)
    other = milvus(milvus_client, space_id)  # another process's writer of the same collection
    encoder = HashEncoder(DIM)
    # Reuse-only admission: the cache itself writes nothing computed into L3, so only ``other`` fills it.
    levels = Levels([memory(100), l3], dim=DIM, dtype=torch.float32, write_behind=False, admit_on_reuse=["L3"])
    with EmbeddingCache(encoder, levels) as cache:
        cache.embed(["x"])
        assert counting.num_gets == 0 and l3.count() == 0
        assert patient.may_hold() is False  # read the count (0): not read again for 3600 s
        other.put_many(cache.space.keys(["y"]), encoder.encode(["y"]))
        assert patient.may_hold() is False
        assert cache.embed_detailed(["y"]).served == {"L1": 0, "L3": 1, "compute": 0}
        assert counting.num_gets == 1
        assert causes(cache) == {"L1": {"never_seen": 2}, "L3": {"bypassed": 1}}


def test_texts_seen_before_the_drift_check_found_another_model_are_drift_at_every_level(redis_client, milvus_client, request):
    encoder = SwappableEncoder(DIM, model=f"fake/{request.node.name}")  # its fingerprint and collections are its own
    # L3 always asked (no empty-collection bypass): the new generation's collection is empty, and a bypass would
    # be counted before the drift.
    settings = Settings(redis_url="redis://unused", milvus_uri="unused.db", write_behind=False, drift_check_interval_s=0,
                        l3_empty_recheck_s=None)
    stores = Stores(redis_client, milvus_client)
    cache = build_cache(settings, stores, encoder)
    monitor = drift_monitor(settings, stores, {encoder.space.model: cache}).start()  # the fingerprint, generation 0
    try:
        cache.embed(["old one", "old two"])
        encoder.version = 1  # another model behind the same name
        assert monitor.check_all() == 1 and cache.generation.value == 1
        result = cache.embed_detailed(["old one", "old two", "new"])
        assert result.served["compute"] == 3
        np.testing.assert_array_equal(result.vectors, encoder.vectors(["old one", "old two", "new"]).numpy())
        once_each = {"never_seen": 3, "drift": 2}
        assert causes(cache) == {"L1": once_each, "L2": once_each, "L3": once_each}
    finally:
        monitor.close()
        cache.close()


def test_the_built_default_bypasses_l3_while_empty_and_until_a_text_proved_reuse(encoder, redis_url, redis_client, tmp_path):
    """The levels the settings build (L1, disk, L2, L3 admitting on reuse) over real LMDB, Redis and Milvus Lite,
    with the real model."""
    client = open_milvus(str(tmp_path / "l3.db"))  # a collection of this test's own: empty at the start
    disk = DiskStore(tmp_path / "disk", capacity_bytes=64 << 20)
    settings = Settings(redis_url=redis_url, milvus_uri=str(tmp_path / "l3.db"), disk_path=str(tmp_path / "disk"),
                        write_behind=False, drift_check=False)
    cache = build_cache(settings, Stores(redis_client, client, disk=disk), encoder)
    try:
        assert cache.level_names == ("L1", "disk", "L2", "L3", "compute")
        assert cache.level_states()["L3"]["admission"] == "reuse"
        l1 = cache.tiers[0]
        assert isinstance(l1, MemoryTier)
        twice, once = [f"asked twice {uuid.uuid4().hex}" for _ in range(2)], [f"asked once {uuid.uuid4().hex}"]
        cache.embed(twice)  # computed: L3 empty, so not asked, and it declines them
        l1.clear()
        assert cache.embed_detailed(twice).served["disk"] == 2  # asked again after leaving L1: admitted into L3
        assert cache.level_states()["L3"]["num_admitted"] == 2
        cache.embed(once)  # L3 holds rows now: asked, a text never seen
        l1.clear()
        disk.clear()
        redis_client.flushall()
        result = cache.embed_detailed(twice + once)
        assert (result.served["L3"], result.served["compute"]) == (2, 1)  # ``once`` never proved reuse: L3 lacks it
        assert causes(cache) == {
            "L1": {"never_seen": 3, "evicted": 5},
            "disk": {"never_seen": 3, "evicted": 3},
            "L2": {"never_seen": 3, "evicted": 3},
            "L3": {"bypassed": 3, "never_seen": 1},
        }
    finally:
        cache.close()
        disk.close()
        client.close()
