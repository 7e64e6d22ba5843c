"""Many replicas: service processes sharing one Redis (L2, prefix registry, single-flight locks) and one Milvus
server (L3, knowledge base). A text one computed is a hit for the other; prefixes registered through one are
seen through the other; a text missed by several at once is computed once in the fleet.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis
import torch

from ragcache.core.cache import ComputeConfig, EmbeddingCache
from ragcache.core.flight import RedisFlight
from ragcache.core.levels import Levels
from ragcache.storage.embedded_milvus import MilvusLiteServer
from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache.tiers import MemoryTier, RedisTier
from ragcache_bench.replicas import stop_replicas
from ragcache_testing.service import ServiceProcess, served
from tests.tcp_proxy import TcpProxy

# Generous: a loaded test machine must not turn a slow holder into a second computation.
WAIT_MS = 60_000


class CountingEncoder:
    """The real model, counting what it computes: one per 'replica', passed to its cache."""

    def __init__(self, encoder):
        self.inner, self.space, self.computed = encoder, encoder.space, []
        self._lock = threading.Lock()

    def encode(self, texts):
        with self._lock:
            self.computed.extend(texts)
        return self.inner.encode(texts)

    def stats(self):
        return self.inner.stats()


def test_two_caches_with_the_real_model_compute_each_text_once(encoder, redis_url):
    """Two replicas in one process: own L1, own model wrapper, own Redis client; one Redis for L2 and locks."""
    texts = [f"replicated question {i}: {uuid.uuid4().hex}" for i in range(96)]
    counters = [CountingEncoder(encoder), CountingEncoder(encoder)]
    clients = [redis.Redis.from_url(redis_url, socket_timeout=5) for _ in counters]
    caches = [
        EmbeddingCache(
            counter,
            Levels([MemoryTier(1 << 20, encoder.space.dim, torch.float32),
                    RedisTier(client, dim=encoder.space.dim, dtype=torch.float32, ttl_s=600)],
                   dim=encoder.space.dim, dtype=torch.float32, fleet_levels=["L2"]),
            compute=ComputeConfig(max_batch=32),
            flight=RedisFlight(client, ttl_ms=WAIT_MS, wait_s=WAIT_MS / 1000),
        )
        for counter, client in zip(counters, clients)
    ]
    orders = [list(range(96)), list(range(95, -1, -1)), list(range(48, 96)) + list(range(48))]
    start = threading.Barrier(len(caches) * len(orders))

    def run(cache, order):
        start.wait(timeout=60)
        return [cache.embed([texts[i] for i in order[s : s + 32]]) for s in range(0, 96, 32)]

    with ThreadPoolExecutor(len(caches) * len(orders)) as pool:
        futures = {(c, o): pool.submit(run, caches[c], orders[o]) for c in range(len(caches)) for o in range(len(orders))}
    computed = counters[0].computed + counters[1].computed
    assert sorted(computed) == sorted(texts), f"computed {len(computed)} times for {len(texts)} texts"
    expected = encoder.encode(texts).numpy()
    for (_, o), future in futures.items():
        np.testing.assert_allclose(np.concatenate(future.result()), expected[orders[o]], rtol=0, atol=1e-5)
    for cache in caches:
        cache.close()
    for client in clients:
        assert list(client.scan_iter(match="*:flight")) == []  # every lock released
        client.close()


# ---- two service processes ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_redis(tmp_path_factory):
    redis_server = EmbeddedRedis(tmp_path_factory.mktemp("replicas-redis"))
    yield redis_server
    redis_server.stop()


@pytest.fixture(scope="module")
def redis_proxy(shared_redis):
    """The first replica reaches the shared Redis through this proxy, so a test can cut it off alone."""
    proxy = TcpProxy("127.0.0.1", shared_redis.port)
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, shared_redis, redis_proxy):
    workdir = tmp_path_factory.mktemp("replicas")
    milvus = MilvusLiteServer(workdir / "milvus" / "shared.db")
    env = {"RAGCACHE_MILVUS_URI": milvus.url,
           "RAGCACHE_SINGLE_FLIGHT_WAIT_MS": str(WAIT_MS), "RAGCACHE_SINGLE_FLIGHT_TTL_MS": str(WAIT_MS)}
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(ServiceProcess, workdir, redis_url=url, extra_env=env)
                   for url in (redis_proxy.url(), shared_redis.url)]
    services = [future.result() for future in futures if future.exception() is None]
    if len(services) < len(futures):
        stop_replicas(services)
        milvus.stop()
        raise next(future.exception() for future in futures if future.exception() is not None)
    yield services
    stop_replicas(services)
    milvus.stop()


def test_a_text_computed_by_one_replica_is_a_hit_for_the_other(replicas):
    first, second = replicas
    texts = [f"asked at replica one {uuid.uuid4().hex}" for _ in range(20)]
    computed = first.post("/embed", {"inputs": texts})
    assert served(computed) == {"L1": 0, "Disk": 0, "L2": 0, "L3": 0, "Compute": 20}
    # No waiting: a computed vector reaches L2 before the answer (the single-flight publish).
    from_l2 = second.post("/embed", {"inputs": texts})
    assert served(from_l2) == {"L1": 0, "Disk": 0, "L2": 20, "L3": 0, "Compute": 0}
    assert from_l2.json() == computed.json()
    assert served(second.post("/embed", {"inputs": texts}))["L1"] == 20


def test_the_prefix_registry_is_shared(replicas):
    first, second = replicas
    name = f"support-{uuid.uuid4().hex[:8]}"
    spec = {"name": name, "text": "You are the support assistant of ACME. Answer briefly.",
            "target": {"base_url": "http://127.0.0.1:9", "model": "none"}, "pinned": False}
    registered = first.client.post("/prefixes", json=spec)
    assert registered.status_code == 201, registered.text
    seen = second.client.get(f"/prefixes/{name}")
    assert seen.status_code == 200 and seen.json()["text"] == spec["text"] and seen.json()["version"] == 1
    assert name in [prefix["name"] for prefix in second.client.get("/prefixes").json()]

    changed = second.client.post("/prefixes", json={**spec, "text": spec["text"] + " Be polite."})
    assert changed.status_code == 200 and first.client.get(f"/prefixes/{name}").json()["version"] == 2
    assert second.client.delete(f"/prefixes/{name}").status_code == 204
    assert first.client.get(f"/prefixes/{name}").status_code == 404


def test_texts_missed_by_both_replicas_at_once_are_computed_once(replicas):
    texts = [f"asked everywhere at once {i} {uuid.uuid4().hex}" for i in range(128)]
    batches = [texts[s : s + 32] for s in range(0, len(texts), 32)]
    start = threading.Barrier(len(replicas))

    def send(replica):
        answers = []
        for batch in batches:
            start.wait(timeout=120)
            answers.append(replica.post("/embed", {"inputs": batch}))
        return answers

    with ThreadPoolExecutor(len(replicas)) as pool:
        answers = list(pool.map(send, replicas))
    num_computed = sum(served(response)["Compute"] for per_replica in answers for response in per_replica)
    assert num_computed == len(texts)
    assert all(served(response)["L3"] == 0 for per_replica in answers for response in per_replica)
    for first, second in zip(*answers):
        np.testing.assert_array_equal(np.array(first.json()), np.array(second.json()))


def _ids(response) -> set[str]:
    return {hit["id"] for hit in response.json()["hits"]}


def test_a_delete_that_cannot_invalidate_the_shared_result_cache_is_refused(replicas, redis_proxy):
    """The cached result lists live in the shared Redis: a delete acknowledged by a replica that could not
    invalidate them there would leave the other replica serving the deleted document until the TTL."""
    cut_off, other = replicas
    collection = f"invalidation_{uuid.uuid4().hex[:8]}"
    documents = [{"id": "kept", "text": "Redis keeps cached search results for a few minutes."},
                 {"id": "deleted", "text": "Cached search results must not outlive the documents they name."}]
    other.post("/documents", {"collection": collection, "documents": documents})
    query = {"query": "cached search results", "collection": collection, "top_k": 5}
    assert _ids(other.post("/search", query)) == {"kept", "deleted"}
    assert other.post("/search", query).json()["result_cache"] == "hit"

    redis_proxy.cut()
    try:
        refused = cut_off.client.request("DELETE", "/documents", json={"collection": collection, "ids": ["deleted"]})
    finally:
        redis_proxy.restore()
    assert refused.status_code == 503, refused.text
    assert "nothing was changed" in refused.json()["error"]["message"]
    # The refused delete changed nothing, so the other replica's cached list is still the truth.
    assert _ids(other.post("/search", query)) == {"kept", "deleted"}

    deleted = cut_off.client.request("DELETE", "/documents", json={"collection": collection, "ids": ["deleted"]})
    assert deleted.status_code == 200, deleted.text
    after = other.post("/search", query).json()
    assert after["result_cache"] == "miss" and {hit["id"] for hit in after["hits"]} == {"kept"}
