"""Storage bounds: the search result cache's value cap, the embedded Redis' memory limit and eviction policy."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
import redis

from ragcache.build import build_cache
from ragcache.retrieval.knowledge import KnowledgeBase
from ragcache.retrieval.result_cache import DECODE_OFF_LOOP_BYTES, ResultCache
from ragcache.settings import Settings
from ragcache.storage.embedded_redis import EVICTION_POLICY
from ragcache.storage.stores import MilvusConnection, Stores


@pytest.fixture
def results(redis_client):
    return ResultCache(redis_client, max_value_bytes=4 * DECODE_OFF_LOOP_BYTES)


def test_a_result_list_over_the_cap_is_not_cached_and_one_under_it_is(results):
    uid = uuid.uuid4().hex
    _, version = results.get(uid, "q-big", "[10]")
    results.put(uid, version, "q-big", "[10]", [["id", 0.5, "x" * (5 * DECODE_OFF_LOOP_BYTES), {}]])
    assert results.get(uid, "q-big", "[10]") == (None, version) and results.num_too_large == 1
    value = [["id", 0.5, "y" * (2 * DECODE_OFF_LOOP_BYTES), {"lang": "en"}]]  # large: decoded off the event loop
    results.put(uid, version, "q-small", "[10]", value)
    assert results.get(uid, "q-small", "[10]") == (value, version)
    assert asyncio.run(results.aget(uid, "q-small", "[10]")) == value


def test_the_knowledge_base_caches_only_result_lists_under_its_cap(milvus_client, redis_client, encoder):
    cache = build_cache(Settings(redis_url="off", milvus_uri="off", write_behind=False), Stores(None, None), encoder)
    kb = KnowledgeBase(milvus_client, redis=redis_client, result_max_bytes=4096)
    name = f"capped_{uuid.uuid4().hex[:8]}"
    documents = [{"id": f"d{i}", "text": f"document {i} about bounded caches " + "filler " * 300} for i in range(5)]
    try:
        kb.add_documents(name, documents, cache=cache)
        outcomes = [kb.search(name, "bounded caches", cache=cache, top_k=5).result_cache for _ in range(2)]
        assert outcomes == ["miss", "miss"]  # 5 x 2 KB of text: over 4096 bytes, never stored
        assert kb.results is not None and kb.results.num_too_large == 2
        kb.add_documents(name, [{"id": "short", "text": "short"}], cache=cache)
        small = [kb.search(name, "short", cache=cache, top_k=1, filter='id == "short"').result_cache for _ in range(2)]
        assert small == ["miss", "hit"]
    finally:
        kb.drop_collection(name)
        cache.close()


def test_the_embedded_redis_is_bounded_and_evicts_cache_entries_never_records(tmp_path):
    settings = Settings(data_dir=tmp_path, milvus_uri="off", embedded_redis_max_bytes=4 * 1024 * 1024)
    stores = Stores.open(settings)
    try:
        client = stores.redis
        assert client is not None
        assert client.config_get("maxmemory")["maxmemory"] == str(4 * 1024 * 1024)  # before: 0, unbounded
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == EVICTION_POLICY == "volatile-lru"
        client.set("rc:prefix:record", "a registered prefix: no TTL")
        value = b"v" * 1500  # about one L2 vector of 384 float32
        for start in range(0, 12_000, 500):  # ~18 MB of TTL'd cache entries into 4 MiB
            with client.pipeline(transaction=False) as pipe:
                for number in range(start, start + 500):
                    pipe.set(f"rc:l2:{number}", value, ex=3600)
                pipe.execute()
        assert int(client.info("stats")["evicted_keys"]) > 0
        assert client.get("rc:prefix:record") == b"a registered prefix: no TTL"
    finally:
        stores.close()


def test_with_only_records_left_a_full_embedded_redis_refuses_writes_rather_than_dropping_them(tmp_path):
    settings = Settings(data_dir=tmp_path, milvus_uri="off", embedded_redis_max_bytes=2 * 1024 * 1024)
    stores = Stores.open(settings)
    try:
        client = stores.redis
        assert client is not None
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for number in range(10_000):
                client.set(f"rc:record:{number}", b"r" * 1000)  # no TTL: never evicted
        assert client.get("rc:record:0") == b"r" * 1000
    finally:
        stores.close()


def test_a_tenant_may_create_only_its_quota_of_collections(tmp_path):
    import json

    import httpx

    from tests.live_server import LiveServer

    keys = {"keys": [
        {"name": "acme", "key": "acme-key-0123456789", "scopes": ["embed", "search", "ingest"], "tenant": "acme"},
        {"name": "ops", "key": "ops-key-0123456789ab", "scopes": "*"},
    ]}
    settings = Settings(redis_url="off", data_dir=tmp_path, api_keys=json.dumps(keys), tenant_max_collections=2)
    document = [{"id": "1", "text": "a document"}]
    with LiveServer(settings) as live:
        def ingest(key: str, collection: str) -> httpx.Response:
            return httpx.post(live.url + "/documents", json={"collection": collection, "documents": document},
                              headers={"Authorization": f"Bearer {key}"}, timeout=60)

        assert [ingest("acme-key-0123456789", name).status_code for name in ("one", "two")] == [200, 200]
        refused = ingest("acme-key-0123456789", "three")
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "quota_exceeded"
        assert "RAGCACHE_TENANT_MAX_COLLECTIONS" in refused.json()["error"]["message"]
        assert refused.json()["error"]["field"] == "collection" and "acme--" not in refused.text
        assert ingest("acme-key-0123456789", "one").status_code == 200  # an existing collection: always
        assert ingest("ops-key-0123456789ab", "three").status_code == 200  # a key without a tenant has no quota


class Clock:
    """A settable clock in seconds, for write times."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _space_keys(space_id: str, count: int) -> list[str]:
    return [f"rc:{space_id}:{number:032x}" for number in range(count)]


@pytest.fixture
def patient_milvus(milvus_client):
    """The session's Milvus Lite (the same server: a second connection to its path) with a deadline no loaded machine
    reaches. The size budget's check is ~40 count queries after each write here (a bisection over write times);
    under the service's 5 s deadline one of ~900 calls exceeded it on a loaded machine, and the test failed with
    a Milvus outage instead of testing the budget. Write times come from the test's clock: nothing else varies."""
    connection = MilvusConnection(milvus_client.uri, timeout_s=600)
    yield connection
    connection.close()


def test_the_l3_size_budget_keeps_the_most_recently_written_rows(patient_milvus):
    import torch

    from ragcache.tiers.milvus import MilvusTier
    from ragcache.tiers.milvus_budget import L3Budget

    space_id, clock = uuid.uuid4().hex[:16], Clock()
    level = MilvusTier(patient_milvus, space_id=space_id, dim=4, dtype=torch.float32,
                       budget=L3Budget(max_rows=10, check_interval_s=0), clock=clock)
    keys = _space_keys(space_id, 30)
    for number, key in enumerate(keys):
        clock.now += 1
        level.put_many([key], torch.full((1, 4), float(number)))
    assert level.get_many(keys).index == list(range(20, 30))  # the ten written last; before: all 30 kept
    assert level.budget.num_evicted == 20


def test_the_l3_age_budget_deletes_rows_written_too_long_ago(patient_milvus):
    import torch

    from ragcache.tiers.milvus import MilvusTier
    from ragcache.tiers.milvus_budget import L3Budget

    space_id, clock = uuid.uuid4().hex[:16], Clock()
    level = MilvusTier(patient_milvus, space_id=space_id, dim=4, dtype=torch.float32,
                       budget=L3Budget(max_age_s=5, check_interval_s=0), clock=clock)
    keys = _space_keys(space_id, 10)
    for number, key in enumerate(keys):
        clock.now += 1
        level.put_many([key], torch.full((1, 4), float(number)))
    # Written at t+1 .. t+10; the last write, at t+10, deleted what was written before t+5.
    assert level.get_many(keys).index == list(range(4, 10))


class Volume:
    """``os.statvfs`` of a volume of ``total_bytes``, for ``default_max_rows``."""

    def __init__(self, total_bytes: int):
        self.total_bytes, self.asked = total_bytes, []

    def __call__(self, path: str):
        self.asked.append(path)
        return os.statvfs_result((4096, 4096, self.total_bytes // 4096, 0, 0, 0, 0, 0, 0, 255))


def test_l3_is_bounded_by_default_by_a_tenth_of_its_volume_in_rows(tmp_path):
    from ragcache.tiers.milvus_budget import DEFAULT_MAX_ROWS, default_max_rows

    row_bytes = 384 * 4 + 520  # measured on Milvus Lite: 2,053 bytes of milvus.db a row at 384 dimensions
    small = Volume(24 << 20)  # the audit's 24 MiB volume: L3 alone could have filled it
    assert default_max_rows(str(tmp_path / "milvus.db"), 384, tmp_path, statvfs=small) == (24 << 20) // 10 // row_bytes
    assert small.asked == [str(tmp_path)]
    assert default_max_rows(str(tmp_path / "milvus.db"), 384, tmp_path, statvfs=Volume(1 << 40)) == DEFAULT_MAX_ROWS
    assert default_max_rows(str(tmp_path / "milvus.db"), 384, tmp_path, statvfs=Volume(1 << 20)) == 1_000  # the floor
    shared = Volume(1 << 30)  # --workers: the shared Milvus Lite's file is in the data folder
    assert default_max_rows("unix:/tmp/rc-milvus-x/milvus.sock", 384, tmp_path / "data", statvfs=shared) == (1 << 30) // 10 // row_bytes
    assert shared.asked == [str(tmp_path)]  # the data folder is not made yet: the volume it will be made on
    assert default_max_rows("http://milvus:19530", 384, tmp_path, statvfs=Volume(1)) == DEFAULT_MAX_ROWS  # a server's own disk


def test_an_l3_built_without_a_size_budget_gets_the_default_one_and_0_means_none(tmp_path, encoder):
    from ragcache.storage.stores import open_milvus
    from ragcache.tiers.milvus_budget import default_max_rows
    from ragcache.tiers.spaces import PerSpaceTier

    db = str(tmp_path / "l3" / "milvus.db")
    stores = Stores(None, open_milvus(db, timeout_s=600))
    try:
        budgets = []
        for configured in (None, 0, 500):
            settings = Settings(redis_url="off", milvus_uri=db, data_dir=tmp_path, write_behind=False, l3_max_rows=configured)
            with build_cache(settings, stores, encoder) as cache:
                l3 = next(tier for tier in cache.tiers if isinstance(tier, PerSpaceTier))
                budgets.append(l3.tier_for(cache.space.space_id).budget.budget.max_rows)
                dim = cache.space.dim
        assert budgets == [default_max_rows(db, dim, tmp_path), None, 500]  # before: None (no bound) when unset
    finally:
        stores.milvus.close()
