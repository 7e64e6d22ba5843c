"""L2 and everything else that uses Redis, on a real Redis Cluster (3 primaries + 3 replicas on loopback).

The Tier contract itself runs on the cluster in test_tier_contract.py; here: how a cluster is recognised,
how keys spread, what a batch costs per node, redirections, the search result cache, the prefix registry,
the service on a cluster, a hung primary (one timeout per batch), and a primary killed while requests keep
coming (none fails; L2 serves again after the replica's promotion).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import httpx
import numpy as np
import pytest
import redis
import torch
from pydantic import ValidationError
from redis.cluster import RedisCluster
from redis.crc import key_slot

from ragcache.build import build_cache
from ragcache.core.cache import EmbeddingCache
from ragcache.core.flight import RedisFlight
from ragcache.core.levels import Levels
from ragcache.errors import ConfigError, TierUnavailableError
from ragcache.prefixes.model import Prefix, PromptForm, Target
from ragcache.prefixes.store import RedisPrefixStore
from ragcache.retrieval.result_cache import ResultCache
from ragcache.settings import Settings
from ragcache.storage.embedded_redis import free_port
from ragcache.storage.embedded_redis_cluster import EmbeddedRedisCluster
from ragcache.storage.redis_client import open_redis
from ragcache.storage.stores import Stores
from ragcache.tiers.redis import RedisTier
from tests.live_server import LiveServer

DIM = 16


def make_keys(n: int) -> list[str]:
    """Keys in the cache's own form: ``rc:<space id>:<128-bit text hash>``."""
    return [f"rc:0123456789abcdef:{uuid.uuid4().hex}" for _ in range(n)]


def counting_connection(sends: Counter) -> type[redis.Connection]:
    """A connection class that counts, per server port, how often it sends: one send is one round trip
    (a pipeline packs all its commands for a node into one send)."""

    class CountingConnection(redis.Connection):
        def send_packed_command(self, command, check_health=True):
            sends[self.port] += 1
            super().send_packed_command(command, check_health)

    return CountingConnection


# ---- finding the cluster ---------------------------------------------------------------------------------


def test_any_node_or_a_seed_list_opens_a_cluster_client_and_a_plain_server_stays_plain(redis_cluster, redis_url, tmp_path):
    replica_port = redis_cluster.nodes[-1].port
    for url in (redis_cluster.url, f"redis://127.0.0.1:{replica_port}", redis_cluster.urls):
        client = open_redis(url, timeout_s=1.0)
        assert isinstance(client, RedisCluster)
        assert sorted(node.port for node in client.get_primaries()) == sorted(redis_cluster.primary_ports())
        client.close()
    single = open_redis(redis_url, timeout_s=1.0)
    assert type(single) is redis.Redis
    single.close()

    settings = Settings(redis_url=" , ".join(redis_cluster.urls.split(",")), milvus_uri="off", data_dir=tmp_path)
    assert settings.levels.redis_url == redis_cluster.urls
    for bad in ("redis://127.0.0.1:7000,unix:///tmp/redis.sock", "redis://127.0.0.1:7000,", "127.0.0.1:7000,127.0.0.1:7001"):
        with pytest.raises(ValidationError, match="seed nodes"):
            Settings(redis_url=bad)
    stores = Stores.open(settings)
    assert isinstance(stores.redis, RedisCluster) and stores.embedded_redis is None
    stores.close()


def test_an_unreachable_seed_list_is_a_config_error_and_an_unreachable_single_url_a_lazy_client():
    nobody = [f"redis://127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(ConfigError, match="Redis Cluster"):
        open_redis(",".join(nobody), timeout_s=0.2)
    later = open_redis(nobody[0], timeout_s=0.2)  # L2 is down until this server appears, as with any Redis
    assert type(later) is redis.Redis
    later.close()


def test_a_cache_opened_from_settings_serves_from_the_cluster(redis_cluster, redis_cluster_client, encoder, tmp_path):
    settings = Settings(redis_url=redis_cluster.url, milvus_uri="off", data_dir=tmp_path, write_behind=False)
    stores = Stores.open(settings)
    with build_cache(settings, stores, encoder, on_close=stores.close) as cache:
        texts = ["a cluster holds this", "and this one", "and a third text"]
        computed = cache.embed(texts)
        cache.tiers[0].clear()  # L1 forgets: the next call must come from the cluster
        again = cache.embed_detailed(texts)
    assert again.served["L2"] == 3
    assert np.array_equal(again.vectors, computed)


# ---- keys and round trips ---------------------------------------------------------------------------------


def test_keys_spread_over_every_primary(redis_cluster, redis_cluster_client, encoder):
    space = encoder.space
    keys = space.keys([f"passage {i}" for i in range(3000)])
    RedisTier(redis_cluster_client, dim=DIM, dtype=torch.float32).put_many(keys, torch.randn(len(keys), DIM))
    per_primary = {port: redis_cluster.client(port).dbsize() for port in redis_cluster.primary_ports()}
    assert sum(per_primary.values()) == 3000
    # Each primary holds a third of the slots; 3000 hashed keys put 1000 +- ~26 on each.
    assert all(800 < count < 1200 for count in per_primary.values()), per_primary
    assert len({key_slot(key.encode()) for key in keys}) > 2500  # no hash tag: nearly one slot per key


@pytest.mark.parametrize("batch", [32, 1000])
@pytest.mark.parametrize("refresh_ttl_on_hit", [False, True])
def test_a_batch_costs_one_round_trip_per_node(redis_cluster, redis_cluster_client, batch, refresh_ttl_on_hit):
    sends: Counter = Counter()
    client = open_redis(redis_cluster.url, timeout_s=1.0, connection_class=counting_connection(sends))
    tier = RedisTier(client, dim=DIM, dtype=torch.float32, ttl_s=60, refresh_ttl_on_hit=refresh_ttl_on_hit)
    keys, vectors = make_keys(batch), torch.randn(batch, DIM)
    tier.put_many(keys[:1], vectors[:1])  # opens a connection to each node it needs, before counting
    tier.get_many(make_keys(batch))
    primaries = set(redis_cluster.primary_ports())

    sends.clear()
    tier.put_many(keys, vectors)
    assert set(sends) == primaries and set(sends.values()) == {1}, sends

    sends.clear()
    hits = tier.get_many(keys)
    assert hits.index == list(range(batch)) and torch.equal(hits.vectors, vectors)
    assert set(sends) == primaries and set(sends.values()) == {1}, sends
    client.close()


def test_corrupt_values_on_any_node_are_misses_and_deleted(redis_cluster, redis_cluster_client):
    tier = RedisTier(redis_cluster_client, dim=DIM, dtype=torch.float32)
    keys, vectors = make_keys(300), torch.randn(300, DIM)
    tier.put_many(keys, vectors)
    positions_on_node: dict[int, list[int]] = {}
    for position, key in enumerate(keys):
        node = redis_cluster_client.nodes_manager.get_node_from_slot(key_slot(key.encode()))
        positions_on_node.setdefault(node.port, []).append(position)
    assert len(positions_on_node) == 3
    damaged = sorted(p for positions in positions_on_node.values() for p in positions[:3])  # three on every node
    for position in damaged:
        value = redis_cluster_client.get(keys[position])
        redis_cluster_client.set(keys[position], value[:-1] + bytes([value[-1] ^ 1]))
    other_type = positions_on_node[redis_cluster.primary_ports()[0]][-1]
    redis_cluster_client.delete(keys[other_type])
    redis_cluster_client.hset(keys[other_type], "field", "another type under our key: absent, as in one MGET")
    hits = tier.get_many(keys)
    kept = [i for i in range(300) if i not in damaged and i != other_type]
    assert hits.index == kept and torch.equal(hits.vectors, vectors[kept])
    assert tier.num_corrupt == len(damaged) == 9
    assert sum(redis_cluster_client.exists(keys[position]) for position in damaged) == 0


def test_moved_and_ask_redirections_are_followed(redis_cluster, redis_cluster_client):
    tier = RedisTier(redis_cluster_client, dim=DIM, dtype=torch.float32)
    keys, vectors = make_keys(200), torch.randn(200, DIM)
    tier.put_many(keys, vectors)
    slot = key_slot(keys[0].encode())
    moving = [key for key in keys if key_slot(key.encode()) == slot]
    source = redis_cluster_client.nodes_manager.get_node_from_slot(slot).port
    target = next(port for port in redis_cluster.primary_ports() if port != source)
    admin = {port: redis_cluster.client(port) for port in redis_cluster.primary_ports()}
    source_id, target_id = (admin[port].execute_command("CLUSTER MYID").decode() for port in (source, target))

    # Mid-migration: the keys are on the target already, the slot still belongs to the source, which answers ASK.
    admin[target].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
    admin[source].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    admin[source].execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *moving)
    with pytest.raises(redis.exceptions.AskError):
        admin[source].get(keys[0])
    hits = tier.get_many(keys)
    assert hits.index == list(range(200)) and torch.equal(hits.vectors, vectors)

    # Migration done: the slot belongs to the target, and the client's stale map meets MOVED.
    for port in [target, source] + [port for port in admin if port not in (target, source)]:
        admin[port].execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    hits = tier.get_many(keys)
    assert hits.index == list(range(200)) and torch.equal(hits.vectors, vectors)
    assert redis_cluster_client.nodes_manager.get_node_from_slot(slot).port == target
    fresh = torch.randn(1, DIM)
    tier.put_many(keys[:1], fresh)
    assert torch.equal(tier.get_many(keys[:1]).vectors, fresh)
    for client in admin.values():
        client.close()


# ---- the other users of Redis --------------------------------------------------------------------------------


def test_search_result_cache_on_the_cluster_blocking_and_asyncio(redis_cluster_client):
    results = ResultCache(redis_cluster_client, ttl_s=60)
    value, version = results.get("collection-uid", "query-key", "k=5")
    assert value is None and version is not None
    results.put("collection-uid", version, "query-key", "k=5", [{"id": 1, "score": 0.5}])
    assert results.get("collection-uid", "query-key", "k=5") == ([{"id": 1, "score": 0.5}], version)

    async def lookup():
        try:
            return await results.aget("collection-uid", "query-key", "k=5")
        finally:
            await results._async_client.aclose()  # the twin lives in this test's event loop only

    assert asyncio.run(lookup()) == [{"id": 1, "score": 0.5}]
    results.bump("collection-uid")
    value, newer = results.get("collection-uid", "query-key", "k=5")
    assert value is None and newer == version + 1


def test_prefix_registry_store_on_the_cluster(redis_cluster_client):
    store = RedisPrefixStore(redis_cluster_client)
    prefix = Prefix(
        name="support", text="You are a helpful assistant.", target=Target("http://127.0.0.1:9", "tiny"),
        is_template=False, form=PromptForm.CHAT, lmcache_controller_url=None, pinned=True, version=1,
        num_tokens=None, content_hash="abc", created_at=1.0, updated_at=1.0,
    )
    store.put(prefix)
    assert store.get("support") == prefix and store.list() == [prefix]
    assert store.delete("support") and store.get("support") is None and store.list() == []


def test_the_service_embeds_searches_and_registers_prefixes_on_the_cluster(redis_cluster, redis_cluster_client, tmp_path):
    settings = Settings(redis_url=redis_cluster.urls, data_dir=tmp_path)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        texts = ["served by a cluster", "each key on its own node"]
        assert http.post("/embed", json={"inputs": texts}).status_code == 200
        cache = live.state.caches[live.state.default_model]
        cache.flush()  # the write-behind worker has stored them in L2
        assert redis_cluster_client.exists(*cache.space.keys(texts)) == 2

        http.post("/documents", json={"collection": "on_cluster", "documents": [{"id": "a", "text": "alpha particles"}]})
        body = {"collection": "on_cluster", "query": "alpha", "top_k": 1}
        assert [http.post("/search", json=body).json()["result_cache"] for _ in range(2)] == ["miss", "hit"]

        prefix = {"name": "cluster-system", "text": "You answer from the documents.", "pinned": False,
                  "target": {"base_url": "http://127.0.0.1:9", "model": "tiny"}}
        assert http.post("/prefixes", json=prefix).status_code == 201
        assert http.get("/prefixes/cluster-system").json()["text"] == prefix["text"]
        assert redis_cluster_client.hexists("rc:prefixes", "cluster-system")


# ---- failures ----------------------------------------------------------------------------------------------------


def test_a_hung_primary_costs_a_batch_one_timeout_not_one_per_key():
    with EmbeddedRedisCluster(replicas_per_primary=0, node_timeout_ms=60_000) as cluster:
        sends: Counter = Counter()
        client = open_redis(cluster.url, timeout_s=0.3, connection_class=counting_connection(sends))
        tier = RedisTier(client, dim=DIM, dtype=torch.float32)
        keys, vectors = make_keys(300), torch.randn(300, DIM)
        tier.put_many(keys, vectors)
        hung = cluster.primary_ports()[1]
        cluster.pause(hung)
        try:
            sends.clear()
            with pytest.raises(TierUnavailableError, match="Timeout"):
                tier.get_many(keys)
            with pytest.raises(TierUnavailableError, match="Timeout"):
                tier.put_many(keys, vectors)
            # The cross-replica locks: Redis failing, every claim is won (computed here, as without locks).
            assert RedisFlight(client, ttl_ms=5000, wait_s=1.0).claim(keys) == [True] * 300
            # About 100 of the keys live on the hung node; resending them one by one would send ~300 times.
            assert sends[hung] <= 6, sends
            # One command (the result cache's, the prefix registry's) is not retried after a timeout either.
            on_hung = next(key for key in keys if client.nodes_manager.get_node_from_slot(key_slot(key.encode())).port == hung)
            sends.clear()
            with pytest.raises(redis.TimeoutError):
                client.get(on_hung)
            assert sends[hung] == 1, sends  # redis-py retries a timeout by default: 2
        finally:
            cluster.resume(hung)
        hits = tier.get_many(keys)
        assert hits.index == list(range(300)) and torch.equal(hits.vectors, vectors)
        client.close()


def test_a_killed_primary_fails_no_request_and_l2_serves_again_after_failover(encoder, record_property):
    texts = [f"failover passage number {i}" for i in range(48)]
    dtype = getattr(torch, encoder.space.dtype)
    with EmbeddedRedisCluster(node_timeout_ms=1000) as cluster:
        client = open_redis(cluster.url, timeout_s=0.5)
        cache = EmbeddingCache(encoder, Levels([RedisTier(client, dim=encoder.space.dim, dtype=dtype)], dim=encoder.space.dim,
                                              dtype=dtype, write_behind=False))
        reference = cache.embed(texts)  # computed, and stored in the cluster
        cluster.wait_replicated()
        victim = cluster.nodes[0].port  # a primary, and the very node the client was given
        served_log: list[tuple[float, dict]] = []
        killed_at = promoted_at = None
        deadline = time.monotonic() + 90
        request = 0
        while time.monotonic() < deadline:
            batch = [texts[(request * 8 + j) % len(texts)] for j in range(8)]
            rows = [(request * 8 + j) % len(texts) for j in range(8)]
            result = cache.embed_detailed(batch)  # must not raise, whatever the cluster is doing
            from_l2 = result.levels == 0
            assert np.array_equal(result.vectors[from_l2], reference[rows][from_l2])
            assert np.allclose(result.vectors, reference[rows], atol=1e-5)
            served_log.append((time.monotonic(), result.served))
            request += 1
            if request == 5:
                cluster.kill(victim)
                killed_at = time.monotonic()
            if killed_at is not None and promoted_at is None and victim not in cluster.primary_ports():
                promoted_at = time.monotonic()
            after = [(t, served) for t, served in served_log if killed_at is not None and t > killed_at]
            if any(served["compute"] for _, served in after) and after and after[-1][1]["L2"] == 8 and len(after) > 3:
                break
            time.sleep(0.02)
        cache.close()
        client.close()

        after = [(t, served) for t, served in served_log if t > killed_at]
        assert any(served["compute"] for _, served in after), "the kill never reached L2"
        assert after[-1][1]["L2"] == 8, f"L2 did not serve again within the deadline: {after[-5:]}"
        last_miss_at = max(t for t, served in after if served["compute"])
        back_at = next(t for t, served in after if t > last_miss_at and served["L2"] == 8)
        assert promoted_at is not None and len(cluster.primary_ports()) == 3
        record_property("replica_promoted_after_kill_s", round(promoted_at - killed_at, 2))
        record_property("l2_back_after_kill_s", round(back_at - killed_at, 2))
        print(
            f"\nreplica promoted {promoted_at - killed_at:.2f} s and L2 serving again {back_at - killed_at:.2f} s after "
            f"SIGKILL of a primary; {len(after)} requests since, none failed"
        )
