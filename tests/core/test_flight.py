"""Cross-process single flight (ragcache/core/flight.py): the waiting logic with a fake clock and fake lookups,
the Redis locks against a real redis-server, and the cache's use of them with a fake model.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis
import torch

from ragcache import Settings, open_cache
from ragcache.core.cache import ComputeConfig, EmbeddingCache
from ragcache.core.flight import RedisFlight, wait_for_holders
from ragcache.core.levels import Levels
from ragcache.core.tier import TierHits
from ragcache.errors import ConfigError
from ragcache.storage.embedded_redis import free_port
from ragcache.tiers import MemoryTier, RedisTier
from ragcache_testing.instant import InstantUpstream
from tests.fakes import HashEncoder

DIM = 8


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class SharedStore:
    """Stands in for L2 and the lock table of another replica: what is published and what is held."""

    def __init__(self):
        self.vectors: dict[str, torch.Tensor] = {}
        self.held: set[str] = set()
        self.fetches: list[list[str]] = []

    def fetch(self, keys):
        self.fetches.append(list(keys))
        index = [i for i, key in enumerate(keys) if key in self.vectors]
        vectors = torch.stack([self.vectors[keys[i]] for i in index]) if index else torch.empty(0, DIM)
        return TierHits(index, vectors)

    def is_held(self, keys):
        return [key in self.held for key in keys]


# ---- the waiting loop (pure logic) -------------------------------------------------------------------------


def test_a_waiter_gets_the_vector_the_holder_publishes_and_backs_off_between_polls():
    clock, store = FakeClock(), SharedStore()
    store.held = {"a", "b"}
    publish_at = {3: "a", 5: "b"}  # the holder publishes "a" before the 3rd fetch, "b" before the 5th

    def fetch(keys):
        key = publish_at.get(len(store.fetches) + 1)
        if key:
            store.vectors[key] = torch.full((DIM,), float(ord(key)))
        return store.fetch(keys)

    found = wait_for_holders(["a", "b"], fetch, store.is_held, wait_s=10.0, clock=clock, sleep=clock.sleep)
    assert sorted(found) == [0, 1]
    assert torch.equal(found[0], torch.full((DIM,), 97.0)) and torch.equal(found[1], torch.full((DIM,), 98.0))
    assert store.fetches == [["a", "b"], ["a", "b"], ["a", "b"], ["b"], ["b"]]
    assert clock.sleeps == [0.005, 0.01, 0.02, 0.04]


def test_a_lock_gone_without_a_vector_ends_the_wait_at_once():
    clock, store = FakeClock(), SharedStore()
    store.held = {"b"}  # "a"'s holder died (its lock expired); "b" is still being computed
    store.vectors["c"] = torch.ones(DIM)  # "c" was published and released already
    found = wait_for_holders(["a", "b", "c"], store.fetch, store.is_held, wait_s=0.05, clock=clock, sleep=clock.sleep)
    assert list(found) == [2]
    assert store.fetches[0] == ["a", "b", "c"] and all(keys == ["b"] for keys in store.fetches[1:])
    assert clock.now == pytest.approx(0.05)  # "b" was waited for until the deadline, "a" not at all


def test_the_deadline_bounds_the_wait():
    clock, store = FakeClock(), SharedStore()
    store.held = {"a"}
    found = wait_for_holders(["a"], store.fetch, store.is_held, wait_s=0.2, clock=clock, sleep=clock.sleep)
    assert found == {}
    assert clock.now == pytest.approx(0.2) and sum(clock.sleeps) == pytest.approx(0.2)
    assert max(clock.sleeps) == 0.05


def test_no_wait_at_all_when_wait_s_is_zero():
    clock, store = FakeClock(), SharedStore()
    store.held = {"a"}
    assert wait_for_holders(["a"], store.fetch, store.is_held, wait_s=0.0, clock=clock, sleep=clock.sleep) == {}
    assert clock.sleeps == [] and len(store.fetches) == 1


# ---- the locks in a real Redis -----------------------------------------------------------------------------


def lock_keys(client) -> list[bytes]:
    return sorted(client.scan_iter(match="*:flight"))


@pytest.fixture(params=["redis_client", "redis_cluster_client"])
def any_redis(request):
    """One redis-server, and a 3-primary Redis Cluster: the locks use single-key commands only."""
    return request.getfixturevalue(request.param)


def test_one_claim_wins_across_processes_and_only_its_owner_releases_it(any_redis):
    first, second = RedisFlight(any_redis, ttl_ms=10_000, wait_s=1), RedisFlight(any_redis, ttl_ms=10_000, wait_s=1)
    assert first.claim(["k1", "k2"]) == [True, True]
    assert second.claim(["k2", "k3"]) == [False, True]
    assert lock_keys(any_redis) == [b"k1:flight", b"k2:flight", b"k3:flight"]
    assert 0 < any_redis.pttl("k1:flight") <= 10_000
    assert second.is_held(["k1", "k2", "nope"]) == [True, True, False]

    second.release(["k2"])  # never claimed by `second`: its release must not delete `first`'s lock
    assert any_redis.get("k2:flight") == first.token.encode()
    first.release(["k1", "k2"])
    second.release(["k3"])
    assert lock_keys(any_redis) == []


def test_claims_of_one_process_are_counted_locally_and_released_by_the_last_holder(redis_client):
    flight = RedisFlight(redis_client, ttl_ms=10_000, wait_s=1)
    assert flight.claim(["k"]) == [True]
    redis_client.delete("k:flight")  # a second claim must not ask Redis again
    assert flight.claim(["k"]) == [True]
    assert lock_keys(redis_client) == []
    redis_client.set("k:flight", flight.token)
    flight.release(["k"])
    assert lock_keys(redis_client) == [b"k:flight"]
    flight.release(["k"])
    assert lock_keys(redis_client) == []


def test_an_expired_lock_can_be_won_and_the_late_holder_does_not_delete_the_new_one(redis_client):
    late, fresh = RedisFlight(redis_client, ttl_ms=10_000, wait_s=1), RedisFlight(redis_client, ttl_ms=10_000, wait_s=1)
    assert late.claim(["k"]) == [True]
    redis_client.delete("k:flight")  # what a TTL expiry does, without sleeping for it
    assert fresh.claim(["k"]) == [True]
    late.release(["k"])
    assert redis_client.get("k:flight") == fresh.token.encode()


class CountingClient:
    """A real client that counts its round trips: the pipelines it opens and the scripts it runs."""

    def __init__(self, client):
        self.client, self.num_round_trips = client, 0

    def pipeline(self, **options):
        self.num_round_trips += 1
        return self.client.pipeline(**options)

    def register_script(self, script):
        registered = self.client.register_script(script)

        def run(**arguments):
            self.num_round_trips += 1
            return registered(**arguments)

        return run


def test_without_redis_every_claim_is_a_win_nothing_raises_and_redis_is_left_alone_for_a_back_off():
    clock = FakeClock()
    client = CountingClient(redis.Redis(port=free_port(), socket_timeout=0.2, socket_connect_timeout=0.2, retry=None))
    flight = RedisFlight(client, ttl_ms=1000, wait_s=1, clock=clock, sleep=clock.sleep)
    assert flight.claim(["a", "b"]) == [True, True]
    assert flight.is_held(["a"]) == [False]
    flight.release(["a", "b"])
    assert client.num_round_trips == 1  # the failure started a back-off: no more attempts
    clock.now += 1.0
    assert flight.claim(["c"]) == [True]
    assert client.num_round_trips == 2  # the back-off passed: tried again


# ---- the cache with a flight -------------------------------------------------------------------------------


class ScriptedFlight:
    """A flight whose claims are decided by the test; records the order of events."""

    def __init__(self, won: list[bool], published: SharedStore, events: list):
        self.won, self.published, self.events = won, published, events

    def claim(self, keys):
        return self.won[: len(keys)]

    def wait(self, keys, fetch):
        self.events.append(("wait", list(keys)))
        clock = FakeClock()
        return wait_for_holders(keys, fetch, self.published.is_held, wait_s=1.0, clock=clock, sleep=clock.sleep)

    def release(self, keys):
        self.events.append(("release", list(keys)))


class RecordingTier:
    """A real level that records its writes; ``before_get`` runs before each lookup (another replica acting).
    It stands for the level replicas share (Redis): the caches below name it in ``fleet_levels``."""

    def __init__(self, tier, name, events, before_get=lambda: None):
        self.tier, self.name, self.events, self.before_get = tier, name, events, before_get

    def get_many(self, keys):
        self.before_get()
        return self.tier.get_many(keys)

    def put_many(self, keys, vectors):
        self.events.append((f"put {self.name}", list(keys)))
        self.tier.put_many(keys, vectors)

    def close(self):
        self.tier.close()


def two_levels(events, before_get=lambda: None):
    return [MemoryTier(100 * DIM * 4, DIM, torch.float32),
            RecordingTier(MemoryTier(100 * DIM * 4, DIM, torch.float32), "L2", events, before_get)]


def test_won_keys_are_published_in_l2_before_release_and_lost_keys_are_taken_from_l2():
    encoder, other_replica, events, store = HashEncoder(DIM), HashEncoder(DIM), [], SharedStore()

    def other_replica_publishes_c_once_we_wait():
        if any(event[0] == "wait" for event in events):
            l2.tier.put_many([key_c], other_replica.encode(["c"]))

    l1, l2 = two_levels(events, other_replica_publishes_c_once_we_wait)
    # Of the two misses ("a", "c") this replica wins "a"; "c" is another's.
    cache = EmbeddingCache(encoder, Levels([l1, l2], dim=DIM, dtype=torch.float32, fleet_levels=["L2"]),
                           flight=ScriptedFlight([True, False], store, events))
    key_a, key_b, key_c = cache.space.keys(["a", "b", "c"])
    l2.tier.put_many([key_b], other_replica.encode(["b"]))  # "b": another replica published it earlier
    store.held = {key_c}

    result = cache.embed_detailed(["a", "b", "c"])
    assert events[:3] == [("put L2", [key_a]), ("release", [key_a]), ("wait", [key_c])]
    assert result.served == {"L1": 0, "L2": 2, "compute": 1}
    assert encoder.calls == [["a"]]
    np.testing.assert_array_equal(result.vectors, HashEncoder(DIM).encode(["a", "b", "c"]).numpy())
    stats = cache.stats()
    assert stats.hits == 2 and stats.texts_computed == 1
    assert cache.embed_detailed(["a", "b", "c"]).served["L1"] == 3
    cache.close()


def test_a_text_whose_holder_died_is_computed_here():
    encoder, events, store = HashEncoder(DIM), [], SharedStore()
    cache = EmbeddingCache(encoder, Levels(two_levels(events), dim=DIM, dtype=torch.float32, write_behind=False, fleet_levels=["L2"]),
                           flight=ScriptedFlight([False, False], store, events))
    result = cache.embed_detailed(["x", "y"])  # both claims lost, but no lock is held and nothing comes
    assert result.served == {"L1": 0, "L2": 0, "compute": 2}
    assert encoder.calls == [["x", "y"]]
    assert [event[0] for event in events] == ["wait", "put L2"]
    np.testing.assert_array_equal(result.vectors, HashEncoder(DIM).encode(["x", "y"]).numpy())
    cache.close()


def test_a_flight_needs_a_shared_level_after_l1():
    with pytest.raises(ConfigError, match="shared level"):
        EmbeddingCache(HashEncoder(DIM), [MemoryTier(1 << 16, DIM, torch.float32)], flight=ScriptedFlight([], SharedStore(), []))
    # A level below L1 that the fleet does not see (the host's disk level) is no place to publish in.
    host_level = RecordingTier(MemoryTier(1 << 16, DIM, torch.float32), "disk", [])
    with pytest.raises(ConfigError, match="shared level"):
        EmbeddingCache(HashEncoder(DIM), [MemoryTier(1 << 16, DIM, torch.float32), host_level],
                       flight=ScriptedFlight([], SharedStore(), []))
    with pytest.raises(ValueError, match="no level named"):
        Levels(two_levels([]), dim=DIM, dtype=torch.float32, fleet_levels=["L9"])


def test_the_table_of_levels_says_which_level_the_fleet_sees(redis_url, tmp_path):
    """Built from ``ragcache.build.LEVELS``: single flight publishes in L2, the first level every replica sees,
    not in the disk level above it, which only this host's processes see."""
    with InstantUpstream() as upstream:
        settings = Settings(models_json=upstream.models_json, model=upstream.model, redis_url=redis_url, milvus_uri="off",
                            data_dir=tmp_path, disk_path=str(tmp_path / "disk"), drift_check=False, single_flight=True)
        with open_cache(settings) as cache:
            assert cache.levels.names == ("L1", "disk", "L2")
            assert cache.levels.shared == 2
            assert cache.resolver._flight is not None


def test_two_caches_on_one_redis_compute_each_text_once(any_redis):
    """Two 'replicas' in one process: separate L1, separate models, one Redis for L2 and the locks."""
    texts = [f"text {i}" for i in range(40)]
    encoders = [HashEncoder(DIM, delay_s=0.05), HashEncoder(DIM, delay_s=0.05)]
    caches = [
        EmbeddingCache(
            encoder,
            Levels([MemoryTier(1 << 16, DIM, torch.float32), RedisTier(any_redis, dim=DIM, dtype=torch.float32, ttl_s=60)],
                   dim=DIM, dtype=torch.float32, fleet_levels=["L2"]),
            compute=ComputeConfig(max_batch=8),
            flight=RedisFlight(any_redis, ttl_ms=10_000, wait_s=10),
        )
        for encoder in encoders
    ]
    start = threading.Barrier(4)
    results = {}

    def run(name, cache, order):
        start.wait()
        results[name] = cache.embed([texts[i] for i in order])

    orders = [range(40), range(39, -1, -1)]
    threads = [threading.Thread(target=run, args=((c, o), caches[c], orders[o])) for c in (0, 1) for o in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    computed = [text for encoder in encoders for call in encoder.calls for text in call]
    assert sorted(computed) == sorted(texts)
    expected = HashEncoder(DIM).encode(texts).numpy()
    for (_, order), vectors in results.items():
        np.testing.assert_array_equal(vectors, expected[list(orders[order])])
    assert lock_keys(any_redis) == []
    for cache in caches:
        cache.close()
