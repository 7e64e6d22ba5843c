"""What an ingest may store (issue 38, item 18): at most ``collection_max_documents`` per collection and
``tenant_max_documents`` across a tenant's collections; past it the ingest is refused whole (409 ``quota_exceeded``
naming the setting), nothing embedded or written. Before, ``milvus.db`` grew without bound under anyone allowed to
ingest, and a full volume took the service down. Real Milvus Lite, the real packaged model."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from ragcache.build import build_cache
from ragcache.errors import QuotaExceededError
from ragcache.retrieval import CollectionName, DocumentQuota, KnowledgeBase
from ragcache.settings import Settings
from ragcache.storage.stores import Stores


def documents(*ids: str) -> list[dict]:
    return [{"id": doc_id, "text": f"document {doc_id} about bounded stores"} for doc_id in ids]


@pytest.fixture(scope="module")
def cache(encoder):
    with build_cache(Settings(redis_url="off", milvus_uri="off", write_behind=False), Stores(None, None), encoder) as built:
        yield built


def test_a_collection_holds_at_most_its_quota_and_an_ingest_past_it_writes_nothing(milvus_client, cache):
    kb = KnowledgeBase(milvus_client, quota=DocumentQuota(max_collection_documents=3))
    name = f"quota_{uuid.uuid4().hex[:8]}"
    try:
        assert kb.add_documents(name, documents("a", "b"), cache=cache).num_inserted == 2
        with pytest.raises(QuotaExceededError, match="RAGCACHE_COLLECTION_MAX_DOCUMENTS") as refused:
            kb.add_documents(name, documents("c", "d"), cache=cache)  # 2 + 2 > 3: refused whole
        assert refused.value.field == "documents"
        assert sorted(kb.list_ids(name)) == ["a", "b"]  # nothing of the refused ingest was written
        # Replacing stored documents adds no row: always allowed, as is filling up to the quota exactly.
        assert kb.add_documents(name, [{"id": "a", "text": "a new text"}], cache=cache).num_replaced == 1
        assert kb.add_documents(name, documents("c"), cache=cache).num_inserted == 1
        with pytest.raises(QuotaExceededError):
            kb.add_documents(name, documents("d"), cache=cache)
        kb.delete_documents(name, ["b"])
        assert kb.add_documents(name, documents("d"), cache=cache).num_inserted == 1  # room again once deleted
    finally:
        kb.drop_collection(name)


def test_a_tenants_collections_together_hold_at_most_its_quota(milvus_client, cache):
    kb = KnowledgeBase(milvus_client, quota=DocumentQuota(max_collection_documents=10, max_tenant_documents=3))
    tenant, other = f"t{uuid.uuid4().hex[:6]}", f"o{uuid.uuid4().hex[:6]}"
    first, second = CollectionName.of("first", tenant), CollectionName.of("second", tenant)
    elsewhere = CollectionName.of("first", other)
    try:
        kb.add_documents(first, documents("a", "b"), cache=cache)
        with pytest.raises(QuotaExceededError, match="RAGCACHE_TENANT_MAX_DOCUMENTS") as refused:
            kb.add_documents(second, documents("c", "d"), cache=cache)
        assert tenant not in str(refused.value)  # the stored names are never shown
        kb.add_documents(second, documents("c"), cache=cache)
        kb.add_documents(elsewhere, documents("a", "b", "c"), cache=cache)  # another tenant has its own quota
    finally:
        for name in (first, second, elsewhere):
            kb.drop_collection(name)


def test_the_service_answers_409_quota_exceeded_naming_the_setting(tmp_path):
    from tests.live_server import LiveServer

    keys = {"keys": [{"name": "acme", "key": "acme-key-0123456789", "scopes": ["embed", "search", "ingest"], "tenant": "acme"}]}
    settings = Settings(redis_url="off", data_dir=tmp_path, api_keys=json.dumps(keys), collection_max_documents=2)
    with LiveServer(settings) as live:
        def ingest(*ids: str) -> httpx.Response:
            return httpx.post(live.url + "/documents", json={"collection": "notes", "documents": documents(*ids)},
                              headers={"Authorization": "Bearer acme-key-0123456789"}, timeout=60)

        assert ingest("a", "b").status_code == 200
        refused = ingest("c")
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["type"] == "quota_exceeded" and error["field"] == "documents"
        assert "RAGCACHE_COLLECTION_MAX_DOCUMENTS" in error["message"] and "'notes'" in error["message"]
        assert "acme--" not in refused.text


def test_an_ingest_that_would_leave_the_volume_under_its_margin_is_refused_whole(milvus_client, cache):
    """The rows bound each collection's bytes only loosely (1,000,000 rows of up to 64 KiB texts); the volume's
    margin is what keeps anyone allowed to ingest from filling it. The free space is a fake volume's."""
    free = {"bytes": 10_000_000}
    kb = KnowledgeBase(milvus_client, quota=DocumentQuota(min_free_bytes=9_000_000, volume_free_bytes=lambda: free["bytes"]))
    name = f"room_{uuid.uuid4().hex[:8]}"
    try:
        assert kb.add_documents(name, documents("a", "b"), cache=cache).num_inserted == 2  # ~3 KB of 1 MB to spare
        big = [{"id": f"big{i}", "text": "x" * 60_000} for i in range(20)]  # 1.2 MB of text: past the margin
        with pytest.raises(QuotaExceededError, match="RAGCACHE_INGEST_MIN_FREE_BYTES") as refused:
            kb.add_documents(name, big, cache=cache)
        assert refused.value.field == "documents"
        assert sorted(kb.list_ids(name)) == ["a", "b"]  # nothing of the refused ingest was written
        assert kb.add_documents(name, documents("a", "b"), cache=cache).num_unchanged == 2  # nothing to write: no check
        free["bytes"] = 20_000_000  # space freed: the same ingest goes in
        assert kb.add_documents(name, big, cache=cache).num_inserted == 20
    finally:
        kb.drop_collection(name)


def test_the_service_refuses_an_ingest_past_the_volumes_margin_with_409(tmp_path):
    """The real volume under the data folder: a margin larger than any disk has refuses every ingest."""
    from tests.live_server import LiveServer

    settings = Settings(redis_url="off", data_dir=tmp_path, ingest_min_free_bytes=1 << 60)
    with LiveServer(settings) as live:
        refused = httpx.post(live.url + "/documents", json={"collection": "notes", "documents": documents("a")}, timeout=60)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["type"] == "quota_exceeded" and error["field"] == "documents"
        assert "RAGCACHE_INGEST_MIN_FREE_BYTES" in error["message"]
