"""Model drift: canary fingerprints kept in real Redis and Milvus Lite, a model swapped behind the same name,
and what the cache serves afterwards (never a vector of the old model)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from ragcache.build import build_cache, drift_monitor
from ragcache.core.keys import EmbeddingSpace, Generation
from ragcache.core.scope import Scope
from ragcache.models.drift import CANARY_TEXTS, TOLERANCES, DriftGuard, fingerprint_distance
from ragcache.models.fingerprints import Fingerprint, Fingerprints, MemoryFingerprints, MilvusFingerprints, RedisFingerprints
from ragcache.settings import Settings
from ragcache.storage.stores import Stores
from tests.fakes import SwappableEncoder

TEXTS = [f"passage {i} about drift" for i in range(12)]
COMPUTED = 3  # EmbeddingCache.level_names with L1, L2, L3: position 3 is compute


@pytest.fixture
def swappable(request):
    """A fresh swappable model named after the test (its fingerprint and collections are its own)."""
    return lambda **kwargs: SwappableEncoder(model=f"fake/{request.node.name}", **kwargs)


def make_cache(encoder, redis_client, milvus_client):
    settings = Settings(redis_url="redis://unused", milvus_uri="unused.db", write_behind=False, drift_check_interval_s=0)
    return build_cache(settings, Stores(redis_client, milvus_client), encoder)


def guard_of(cache, redis_client, milvus_client, name="fake"):
    return DriftGuard(name, cache.encoder, Fingerprints.of(redis_client, milvus_client), cache.generation)


def test_generation_zero_keeps_the_space_id_and_others_change_it():
    space = EmbeddingSpace(model="m", revision="r", dtype="float32", dim=8, normalize=False, max_seq_length=16)
    assert "generation" not in space.canonical()
    assert EmbeddingSpace(**{**_init_fields(space), "generation": 0}).space_id == space.space_id
    moved = EmbeddingSpace(**{**_init_fields(space), "generation": 1})
    assert moved.space_id != space.space_id and '"generation":1' in moved.canonical()


def _init_fields(space):
    return {k: v for k, v in space.describe().items() if k not in ("space_id", "key_format")}  # derived, not given


def test_distance_is_relative_and_infinite_across_dimensions():
    stored = np.array([[3.0, 4.0], [1.0, 0.0]], dtype=np.float32)
    assert fingerprint_distance(stored, stored) == 0.0
    assert fingerprint_distance(stored + np.array([[0.05, 0.0], [0.0, 0.0]], np.float32), stored) == pytest.approx(0.01)
    assert fingerprint_distance(stored[:, :1], stored) == float("inf")
    assert TOLERANCES["float32"] < TOLERANCES["float16"] < TOLERANCES["bfloat16"]


def test_first_check_stores_the_fingerprint_and_a_swap_is_a_new_generation(swappable):
    encoder, store = swappable(), MemoryFingerprints()
    guard = DriftGuard("fake", encoder, Fingerprints([store]), Generation())
    assert guard.check() is False
    assert store.load(encoder.space.space_id).generation == 0
    assert guard.check() is False  # same model: same canaries
    encoder.version = 1
    assert guard.check() is True
    state = guard.state()
    assert (state.generation, state.num_drift_events, state.num_checks) == (1, 1, 3)
    assert state.last_distance > TOLERANCES["float32"] and state.last_drift_at is not None
    assert store.load(encoder.space.space_id).generation == 1
    assert guard.check() is False and guard.state().generation == 1


def test_canaries_go_to_the_model_not_the_cache(swappable):
    encoder = swappable()
    DriftGuard("fake", encoder, Fingerprints([]), Generation()).check()
    assert encoder.calls == [list(CANARY_TEXTS)]


def test_no_old_vector_is_served_from_any_level_after_a_swap(redis_client, milvus_client, swappable):
    encoder = swappable()
    cache = make_cache(encoder, redis_client, milvus_client)
    guard = guard_of(cache, redis_client, milvus_client)
    guard.check()
    old = cache.embed(TEXTS)
    np.testing.assert_array_equal(old, encoder.vectors(TEXTS).numpy())
    assert (cache.embed_detailed(TEXTS).levels == 0).all()  # all in L1 now, and in L2 and L3

    encoder.version = 1
    assert guard.check() is True
    result = cache.embed_detailed(TEXTS)
    assert (result.levels == COMPUTED).all()
    np.testing.assert_array_equal(result.vectors, encoder.vectors(TEXTS).numpy())
    assert cache.space.generation == 1 and cache.stats().space_id == cache.space.space_id
    cache.close()


def test_restart_agrees_on_the_generation_and_serves_the_new_vectors(redis_client, milvus_client, swappable):
    encoder = swappable()
    first = make_cache(encoder, redis_client, milvus_client)
    guard_of(first, redis_client, milvus_client).check()
    first.embed(TEXTS)
    encoder.version = 1
    guard_of(first, redis_client, milvus_client).check()
    new = first.embed(TEXTS)
    first.close()

    # A restart (a new process: new caches, a fresh generation object) with the same changed model.
    second = make_cache(encoder, redis_client, milvus_client)
    guard = guard_of(second, redis_client, milvus_client)
    assert guard.check() is False and guard.state().num_drift_events == 0
    assert second.space.generation == 1
    result = second.embed_detailed(TEXTS)
    assert (result.levels == 1).all()  # L2 of generation 1: the new model's vectors, kept across the restart
    np.testing.assert_array_equal(result.vectors, new)
    second.close()


def test_milvus_alone_keeps_the_generation_when_redis_lost_it(redis_client, milvus_client, swappable):
    encoder = swappable(dim=6)
    guard = DriftGuard("fake", encoder, Fingerprints.of(redis_client, milvus_client), Generation())
    guard.check()
    encoder.version = 1
    guard.check()
    redis_client.flushall()
    restarted = DriftGuard("fake", encoder, Fingerprints.of(redis_client, milvus_client), Generation())
    assert restarted.check() is False and restarted.state().generation == 1
    assert RedisFingerprints(redis_client).load(encoder.space.space_id).generation == 1  # put back


def two_replicas_agree_on_one_generation(client, encoder) -> None:
    """Two replicas' guards over one store notice a new model at once: one bumps the generation, the other adopts it."""
    replicas = [DriftGuard("fake", encoder, Fingerprints.of(client), Generation()) for _ in range(2)]
    for guard in replicas:
        guard.check()
    encoder.version = 1
    assert [guard.check() for guard in replicas] == [True, True]  # one bumped it, the other adopted it
    assert [guard.state().generation for guard in replicas] == [1, 1]


def test_two_replicas_noticing_at_once_agree_on_one_generation(redis_client, swappable):
    two_replicas_agree_on_one_generation(redis_client, swappable())


def test_a_replica_with_another_model_never_shares_a_generation(redis_client, swappable):
    old, new = swappable(), swappable()
    new.version = 1
    fingerprints = Fingerprints.of(redis_client)
    guard_old, guard_new = DriftGuard("m", old, fingerprints, Generation()), DriftGuard("m", new, fingerprints, Generation())
    guard_old.check()
    guard_new.check()
    assert (guard_old.state().generation, guard_new.state().generation) == (0, 1)
    guard_old.check()  # the old model does not match generation 1: a generation of its own
    assert guard_old.state().generation == 2


def test_compare_and_set_refuses_a_stale_writer(redis_client):
    store = RedisFingerprints(redis_client)
    vectors = np.ones((2, 3), dtype=np.float32)
    assert store.save("s", Fingerprint(0, vectors), expected=None)
    assert not store.save("s", Fingerprint(1, vectors), expected=None)
    assert store.save("s", Fingerprint(1, vectors * 2), expected=0)
    assert not store.save("s", Fingerprint(1, vectors), expected=0)
    loaded = store.load("s")
    assert loaded.generation == 1
    np.testing.assert_array_equal(loaded.vectors, vectors * 2)


def test_milvus_fingerprint_round_trips(milvus_client):
    store = MilvusFingerprints(milvus_client)
    vectors = np.arange(24, dtype=np.float32).reshape(8, 3) / 7
    assert store.load("roundtrip") is None
    store.save("roundtrip", Fingerprint(4, vectors), expected=None)
    loaded = store.load("roundtrip")
    assert loaded.generation == 4
    np.testing.assert_array_equal(loaded.vectors, vectors)


def test_a_request_racing_the_switch_never_writes_old_vectors_into_the_new_generation(redis_client, milvus_client, swappable):
    encoder = swappable()
    cache = make_cache(encoder, redis_client, milvus_client)
    guard = guard_of(cache, redis_client, milvus_client)
    guard.check()
    encoder.hold = threading.Event()
    results = {}
    request = threading.Thread(target=lambda: results.setdefault("old", cache.embed(TEXTS)))
    request.start()
    assert encoder.entered.wait(timeout=30)  # the request took generation 0 and computes with model 0
    encoder.version = 1
    assert guard.check() is True
    encoder.hold.set()  # ... and writes its model-0 vectors only now, after the switch
    request.join(timeout=30)
    np.testing.assert_array_equal(results["old"], encoder.vectors(TEXTS, version=0).numpy())

    result = cache.embed_detailed(TEXTS)
    assert (result.levels == COMPUTED).all()
    np.testing.assert_array_equal(result.vectors, encoder.vectors(TEXTS).numpy())
    cache.close()


def test_the_monitor_switches_tenants_caches_with_the_model(redis_client, milvus_client, swappable):
    encoder = swappable()
    shared = make_cache(encoder, redis_client, milvus_client)
    settings = Settings(redis_url="redis://unused", milvus_uri="unused.db", write_behind=False, drift_check_interval_s=0)
    monitor = drift_monitor(settings, Stores(redis_client, milvus_client), {"fake": shared}).start()
    tenant = shared.scoped(Scope(tenant="acme"))
    tenant.embed(TEXTS)
    encoder.version = 1
    assert monitor.check_all() == 1
    result = tenant.embed_detailed(TEXTS)
    assert (result.levels == COMPUTED).all() and tenant.space.generation == 1 and tenant.space.namespace == "acme"
    np.testing.assert_array_equal(result.vectors, encoder.vectors(TEXTS).numpy())
    assert [s.num_drift_events for s in monitor.states()] == [1]
    monitor.close()
    shared.close()


def test_a_failing_model_keeps_the_generation_and_counts_the_error(swappable):
    encoder = swappable()
    guard = DriftGuard("fake", encoder, Fingerprints([]), Generation())
    guard.check()

    def broken(texts):
        return torch.full((len(texts), encoder.space.dim), float("nan"))

    encoder.encode = broken
    from ragcache.models.drift import DriftMonitor

    assert DriftMonitor([guard]).check_all() == 0
    state = guard.state()
    assert (state.generation, state.num_check_errors) == (0, 1) and "not finite" in state.last_error


def test_an_operator_tolerance_absorbs_a_noisy_upstream(swappable):
    encoder = swappable()
    guard = DriftGuard("fake", encoder, Fingerprints([]), Generation(), tolerance=10.0)
    guard.check()
    encoder.version = 1  # unrelated vectors: a relative distance of about 1.4, under this tolerance
    assert guard.check() is False and guard.state().generation == 0 and guard.state().tolerance == 10.0


def test_a_collection_of_the_old_model_refuses_new_queries_and_says_why(redis_client, milvus_client, swappable):
    from ragcache.errors import ConflictError
    from ragcache.retrieval.documents import Document
    from ragcache.retrieval.knowledge import KnowledgeBase

    encoder = swappable()
    cache = make_cache(encoder, redis_client, milvus_client)
    guard = guard_of(cache, redis_client, milvus_client)
    guard.check()
    kb = KnowledgeBase(milvus_client)
    collection = f"drift_{abs(hash(encoder.space.model)) % 10**8}"
    kb.add_documents(collection, [Document("a", "old model's document")], cache=cache)
    encoder.version = 1
    guard.check()
    # Its vectors came from the old model: comparing them with a new model's query would rank nonsense.
    with pytest.raises(ConflictError, match="generation 1"):
        kb.search(collection, "a query", cache=cache)
    cache.close()


def test_the_compare_and_set_works_on_a_redis_cluster(redis_cluster_client, swappable):
    encoder = swappable()
    two_replicas_agree_on_one_generation(redis_cluster_client, encoder)
    assert RedisFingerprints(redis_cluster_client).load(encoder.space.space_id).generation == 1
