"""KnowledgeBase against a real Milvus Lite, a real Redis and the real packaged model.

The Milvus database is the session's (Milvus Lite allows one process per file), so every test works in
collections of its own name.
"""

from __future__ import annotations

import logging
import socket

import pytest
import redis
from pymilvus import MilvusException
from pymilvus.client.types import LoadState

from ragcache.errors import ConflictError, InvalidInputError, NotFoundError, TierUnavailableError
from ragcache.retrieval.documents import Document, milvus_collection_name
from ragcache.retrieval.knowledge import KnowledgeBase
from ragcache.storage.stores import open_milvus
from tests.retrieval.conftest import l1_only_cache

DOCS = [
    {"id": "kv", "text": "vLLM keeps the attention keys and values of a prompt prefix in its KV cache.",
     "metadata": {"lang": "en", "topic": "llm"}},
    {"id": "bread", "text": "Knead the dough for ten minutes and let it rise before baking the bread.",
     "metadata": {"lang": "en", "topic": "cooking"}},
    {"id": "redis", "text": "Redis is an in-memory key-value store often used as a shared cache.",
     "metadata": {"lang": "en", "topic": "databases"}},
    {"id": "berlin", "text": "Berlin ist die Hauptstadt von Deutschland.", "metadata": {"lang": "de", "topic": "geo"}},
]


@pytest.fixture(scope="module")
def other_cache():
    """A second space: the same model with an instruction prompt, so every vector differs."""
    from ragcache.models.local import ModelEncoder

    with l1_only_cache(ModelEncoder(prompt="query: ")) as embedding_cache:
        yield embedding_cache


@pytest.fixture
def kb(milvus_client):
    return KnowledgeBase(milvus_client)


@pytest.fixture
def cached_kb(milvus_client, redis_client):
    return KnowledgeBase(milvus_client, redis=redis_client)


def test_ingest_then_search_finds_the_relevant_document_first(kb, cache):
    result = kb.add_documents("ingest-search", DOCS, cache=cache)
    assert (result.num_received, result.num_inserted, result.num_replaced) == (4, 4, 0)
    assert (result.num_cached, result.num_computed) == (0, 4)

    found = kb.search("ingest-search", "How does an LLM server cache attention keys?", cache=cache, top_k=2)
    assert [hit.id for hit in found.hits][0] == "kv"
    assert len(found.hits) == 2
    assert found.hits[0].score > found.hits[1].score
    assert found.hits[0].text == DOCS[0]["text"]
    assert found.hits[0].metadata == {"lang": "en", "topic": "llm"}
    assert found.embedding_level == "compute"
    assert found.result_cache == "off"
    assert found.timings_ms.total >= found.timings_ms.embed + found.timings_ms.search - 0.01

    again = kb.search("ingest-search", "How does an LLM server cache attention keys?", cache=cache, top_k=2)
    assert again.embedding_level == "L1"


def test_reingest_replaces_by_id_and_embeddings_come_from_the_cache(kb, cache):
    kb.add_documents("reingest", DOCS, cache=cache)
    unchanged = kb.add_documents("reingest", DOCS, cache=cache)
    assert (unchanged.num_inserted, unchanged.num_replaced, unchanged.num_unchanged) == (0, 0, 4)
    # New metadata, same texts: every document replaced, every embedding from the cache.
    relabelled = [{**doc, "metadata": {**doc["metadata"], "v": 2}} for doc in DOCS]
    result = kb.add_documents("reingest", relabelled, cache=cache)
    assert (result.num_inserted, result.num_replaced) == (0, 4)
    assert (result.num_cached, result.num_computed) == (4, 0)
    assert result.served == {"L1": 4, "compute": 0}
    assert kb.collection_info("reingest").num_documents == 4


def test_upsert_replaces_text_and_metadata(kb, cache):
    kb.add_documents("upsert", [Document("a", "Cats sleep most of the day.", {"v": 1})], cache=cache)
    kb.add_documents("upsert", [Document("a", "Rockets need fuel to reach orbit.", {"v": 2})], cache=cache)
    hits = kb.search("upsert", "space travel", cache=cache).hits
    assert [(hit.id, hit.text, hit.metadata) for hit in hits] == [("a", "Rockets need fuel to reach orbit.", {"v": 2})]


def test_delete_counts_only_existing_ids(kb, cache):
    kb.add_documents("delete", DOCS, cache=cache)
    assert kb.delete_documents("delete", ["kv", "no-such-id", "kv"]) == 1
    assert kb.delete_documents("delete", ["kv"]) == 0
    assert kb.collection_info("delete").num_documents == 3
    hits = kb.search("delete", "attention keys and values cache", cache=cache, top_k=10).hits
    assert "kv" not in {hit.id for hit in hits}


def test_get_documents_in_the_order_asked_and_in_batches(kb, cache):
    kb.add_documents("get", DOCS, cache=cache)
    got = kb.get_documents("get", ["redis", "no-such-id", "kv", "redis"])
    assert got == [Document("redis", DOCS[2]["text"], DOCS[2]["metadata"]), Document("kv", DOCS[0]["text"], DOCS[0]["metadata"])]
    batches = list(kb.document_batches("get", [document["id"] for document in DOCS]))
    assert sorted(document.id for batch in batches for document in batch) == sorted(document["id"] for document in DOCS)
    with pytest.raises(NotFoundError):
        kb.get_documents("no-such-collection", ["kv"])


def test_filter_on_metadata(kb, cache):
    kb.add_documents("filter", DOCS, cache=cache)
    hits = kb.search("filter", "capital city", cache=cache, filter='metadata["lang"] == "de"').hits
    assert [hit.id for hit in hits] == ["berlin"]
    hits = kb.search("filter", "cache", cache=cache, filter='metadata["topic"] in ["llm", "databases"]').hits
    assert {hit.id for hit in hits} == {"kv", "redis"}
    assert len(kb.search("filter", "cache", cache=cache, filter="  ").hits) == 4  # blank = no filter


# docs/retrieval.md's table of filters, each run against Milvus Lite: the documented forms work as written.
@pytest.mark.parametrize("expression, expected", [
    ('metadata["topic"] == "databases"', {"redis"}),
    ('metadata["year"] >= 2020 and metadata["lang"] in ["en", "de"]', {"kv", "berlin"}),
    ('metadata["source"] like "guides/%"', {"kv"}),
    ('id in ["kv", "berlin"]', {"kv", "berlin"}),
])
def test_the_documented_filter_forms(kb, cache, expression, expected):
    documents = [{**DOCS[0], "metadata": {**DOCS[0]["metadata"], "year": 2024, "source": "guides/kv.md"}},
                 *DOCS[1:3], {**DOCS[3], "metadata": {**DOCS[3]["metadata"], "year": 2021, "source": "notes/berlin.md"}}]
    kb.add_documents("documented-filters", documents, cache=cache)
    hits = kb.search("documented-filters", "anything", cache=cache, top_k=10, filter=expression).hits
    assert {hit.id for hit in hits} == expected


@pytest.mark.parametrize("expression", ['metadata["lang"] ==', "no_such_field == 1", "))", 'metadata["lang"] = "de"', 'topic == "db"'])
def test_bad_filter_is_invalid_input_naming_the_field_with_an_example(kb, cache, expression):
    kb.add_documents("bad-filter", DOCS[:1], cache=cache)
    with pytest.raises(InvalidInputError) as info:
        kb.search("bad-filter", "anything", cache=cache, filter=expression)
    assert info.value.field == "filter"
    assert "filter" in str(info.value)
    assert 'metadata["topic"] == "db"' in str(info.value)  # what a filter looks like, not just "invalid parameter"


def test_unknown_collection_is_not_found(kb, cache):
    with pytest.raises(NotFoundError, match="'nowhere'"):
        kb.search("nowhere", "query", cache=cache)
    with pytest.raises(NotFoundError):
        kb.delete_documents("nowhere", ["a"])
    with pytest.raises(NotFoundError):
        kb.collection_info("nowhere")
    with pytest.raises(NotFoundError):
        kb.drop_collection("nowhere")


def test_other_space_is_a_conflict(kb, cache, other_cache):
    assert other_cache.space.space_id != cache.space.space_id
    kb.add_documents("one-space", DOCS[:2], cache=cache)
    with pytest.raises(ConflictError, match=cache.space.space_id):
        kb.search("one-space", "query", cache=other_cache)
    with pytest.raises(ConflictError):
        kb.add_documents("one-space", DOCS[2:], cache=other_cache)
    assert kb.collection_info("one-space").num_documents == 2


def test_result_cache_hit_then_invalidated_by_ingest_and_delete(cached_kb, cache):
    cached_kb.add_documents("results", DOCS[1:], cache=cache)
    first = cached_kb.search("results", "attention key value cache", cache=cache, top_k=3)
    second = cached_kb.search("results", "attention key value cache", cache=cache, top_k=3)
    assert (first.result_cache, second.result_cache) == ("miss", "hit")
    assert second.hits == first.hits
    assert second.embedding_level is None and second.timings_ms.embed == 0.0
    # Other parameters are other results.
    assert cached_kb.search("results", "attention key value cache", cache=cache, top_k=2).result_cache == "miss"

    cached_kb.add_documents("results", DOCS[:1], cache=cache)
    after_ingest = cached_kb.search("results", "attention key value cache", cache=cache, top_k=3)
    assert after_ingest.result_cache == "miss"
    assert after_ingest.hits[0].id == "kv"

    cached_kb.delete_documents("results", ["kv"])
    after_delete = cached_kb.search("results", "attention key value cache", cache=cache, top_k=3)
    assert after_delete.result_cache == "miss"
    assert "kv" not in {hit.id for hit in after_delete.hits}


def test_result_cache_is_shared_between_instances_and_not_reused_after_recreate(milvus_client, redis_client, cache):
    writer = KnowledgeBase(milvus_client, redis=redis_client)
    reader = KnowledgeBase(milvus_client, redis=redis_client)
    writer.add_documents("recreate", DOCS[:2], cache=cache)
    assert reader.search("recreate", "bread", cache=cache).result_cache == "miss"
    writer.add_documents("recreate", DOCS[2:], cache=cache)  # another instance's ingest invalidates
    assert reader.search("recreate", "bread", cache=cache).result_cache == "miss"
    assert reader.search("recreate", "bread", cache=cache).result_cache == "hit"

    writer.drop_collection("recreate")
    writer.add_documents("recreate", DOCS[3:], cache=cache)
    fresh = writer.search("recreate", "bread", cache=cache)
    assert fresh.result_cache == "miss"
    assert [hit.id for hit in fresh.hits] == ["berlin"]


def _dead_redis() -> redis.Redis:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return redis.Redis(port=port, socket_connect_timeout=0.2, socket_timeout=0.2)


def test_redis_down_skips_the_result_cache_for_searches(milvus_client, cache):
    KnowledgeBase(milvus_client).add_documents("no-redis", DOCS, cache=cache)
    found = KnowledgeBase(milvus_client, redis=_dead_redis()).search("no-redis", "bread", cache=cache)
    assert found.result_cache == "off"
    assert found.hits[0].id == "bread"


def test_a_write_whose_invalidation_redis_cannot_take_is_refused_before_it_changes_anything(milvus_client, cache):
    """Other replicas read the same Redis: a write acknowledged without its bump would leave them serving the
    collection as it was until the TTL. Redis is asked first, so the refusal comes before any change."""
    kb = KnowledgeBase(milvus_client, redis=_dead_redis())
    with pytest.raises(TierUnavailableError, match="could not be invalidated; nothing was changed"):
        kb.add_documents("refused-write", DOCS, cache=cache)
    assert KnowledgeBase(milvus_client).collection_info("refused-write").num_documents == 0
    KnowledgeBase(milvus_client).add_documents("refused-write", DOCS[:1], cache=cache)
    with pytest.raises(TierUnavailableError, match="nothing was changed"):
        kb.delete_documents("refused-write", ["kv"])
    assert KnowledgeBase(milvus_client).collection_info("refused-write").num_documents == 1


class FailingIncr:
    """A real Redis client whose INCR fails once armed (fault injection for the bump after a write)."""

    def __init__(self, client: redis.Redis):
        self.client, self.armed = client, False

    def __getattr__(self, name):
        return getattr(self.client, name)

    def incr(self, key):
        if self.armed:
            raise redis.ConnectionError("injected: the connection dropped")
        return self.client.incr(key)


def test_a_write_whose_second_bump_fails_is_not_acknowledged(milvus_client, redis_client, cache):
    """A search during a write may cache the old contents at the version the first bump made; only the
    second bump clears that, so the write fails (503 in the service) when the second one does not land."""
    flaky = FailingIncr(redis_client)

    class ArmedByUpsert:
        """The real Milvus client; an upsert arms the Redis fault once Milvus has taken the rows."""

        def __getattr__(self, name):
            return getattr(milvus_client, name)

        def upsert(self, *args, **kwargs):
            result = milvus_client.upsert(*args, **kwargs)
            flaky.armed = True
            return result

    kb = KnowledgeBase(ArmedByUpsert(), redis=flaky)
    with pytest.raises(TierUnavailableError, match="may have landed"):
        kb.add_documents("second-bump", DOCS[2:], cache=cache)
    assert KnowledgeBase(milvus_client).collection_info("second-bump").num_documents == 2


class BrokenCollections:
    """The real Milvus client, except that the named Milvus collections fail as a sick server's would: they
    cannot be loaded (``load_collection``) or cannot even be described (``describe_collection``)."""

    def __init__(self, client, *, unloadable: set[str] = frozenset(), unreadable: set[str] = frozenset()):
        self.client, self.unloadable, self.unreadable = client, unloadable, unreadable

    def __getattr__(self, name):
        return getattr(self.client, name)

    def load_collection(self, milvus_name, **kwargs):
        if milvus_name in self.unloadable:
            raise MilvusException(code=65535, message="injected: not enough memory to load the collection")
        return self.client.load_collection(milvus_name, **kwargs)

    def describe_collection(self, milvus_name, **kwargs):
        if milvus_name in self.unreadable:
            raise MilvusException(code=65535, message="injected: the collection's metadata cannot be read")
        return self.client.describe_collection(milvus_name, **kwargs)


def test_listing_reads_only_the_prefix_and_loads_nothing(milvus_client, cache):
    """Listing loaded every collection in the database before filtering by tenant: one tenant's collection
    that could not be loaded made everyone's listing a 503 naming it."""
    kb = KnowledgeBase(milvus_client)
    for name in ("acme--fine", "acme--unloadable", "globex--own"):
        kb.add_documents(name, DOCS[:2], cache=cache)
    reader = KnowledgeBase(BrokenCollections(milvus_client, unloadable={milvus_collection_name("acme--unloadable")}))
    assert [info.name for info in reader.list_collections(prefix="globex--")] == ["globex--own"]
    listed = reader.list_collections(prefix="acme--")
    assert [(info.name, info.num_documents) for info in listed] == [("acme--fine", 2), ("acme--unloadable", 2)]


def test_listing_leaves_out_a_collection_that_fails_and_logs_it(milvus_client, cache, caplog):
    kb = KnowledgeBase(milvus_client)
    for name in ("listed--fine", "listed--unreadable"):
        kb.add_documents(name, DOCS[:1], cache=cache)
    broken = BrokenCollections(milvus_client, unreadable={milvus_collection_name("listed--unreadable")})
    with caplog.at_level(logging.WARNING, logger="ragcache.retrieval.knowledge"):
        assert [info.name for info in KnowledgeBase(broken).list_collections(prefix="listed--")] == ["listed--fine"]
    assert "'listed--unreadable' left out of the listing" in caplog.text
    with pytest.raises(TierUnavailableError, match="listed--unreadable"):
        KnowledgeBase(broken).list_collections(prefix="listed--u")  # all it had failed: an error, not an empty list


def test_listing_counts_documents_without_loading_a_collection(milvus_client, cache):
    kb = KnowledgeBase(milvus_client)
    kb.add_documents("unloaded", DOCS, cache=cache)
    kb.delete_documents("unloaded", ["kv"])
    milvus_client.release_collection(milvus_collection_name("unloaded"))
    infos = {info.name: info for info in KnowledgeBase(milvus_client).list_collections(prefix="unloaded")}
    assert infos["unloaded"].num_documents == 3
    assert milvus_client.get_load_state(milvus_collection_name("unloaded"))["state"] == LoadState.NotLoad


def test_a_collection_record_is_read_again_after_its_ttl(milvus_client, cache, other_cache):
    """Another process dropped the collection and made it again in another space: within the record TTL this
    process still holds the old record, after it the new one."""
    clock = FakeClock()
    reader = KnowledgeBase(milvus_client, clock=clock, record_ttl_s=30)
    writer = KnowledgeBase(milvus_client)
    writer.add_documents("recreated-space", DOCS[:2], cache=cache)
    assert reader.search("recreated-space", "bread", cache=cache).hits
    writer.drop_collection("recreated-space")
    writer.add_documents("recreated-space", DOCS[2:], cache=other_cache)
    clock.now += 31
    found = reader.search("recreated-space", "Hauptstadt", cache=other_cache, top_k=2)
    assert {hit.id for hit in found.hits} == {"redis", "berlin"}


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_list_collections_names_spaces_and_sizes(milvus_client, cache):
    kb = KnowledgeBase(milvus_client)
    kb.add_documents("list-a_b", DOCS[:1], cache=cache)
    kb.add_documents("list-a-b", DOCS[:3], cache=cache)
    kb.create_collection("list-empty", cache=cache)
    infos = {info.name: info for info in KnowledgeBase(milvus_client).list_collections()}  # a fresh process view
    assert infos["list-a_b"].num_documents == 1
    assert infos["list-a-b"].num_documents == 3
    assert infos["list-empty"].num_documents == 0
    assert infos["list-a-b"].space_id == cache.space.space_id
    assert infos["list-a-b"].model == cache.space.model and infos["list-a-b"].dim == 384
    assert not any(name.startswith("rc_") for name in infos)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda kb, c: kb.search("bad name", "q", cache=c), "collection"),
        (lambda kb, c: kb.search("1abc", "q", cache=c), "collection"),
        (lambda kb, c: kb.search("x" * 64, "q", cache=c), "collection"),
        (lambda kb, c: kb.search("ok", "  ", cache=c), "query"),
        (lambda kb, c: kb.search("ok", "q\ud800", cache=c), "query"),
        (lambda kb, c: kb.search("ok", "q", cache=c, top_k=0), "top_k"),
        (lambda kb, c: kb.search("ok", "q", cache=c, top_k=1001), "top_k"),
        (lambda kb, c: kb.search("ok", "q", cache=c, top_k=True), "top_k"),
        (lambda kb, c: kb.search("ok", "q", cache=c, filter=3), "filter"),
        (lambda kb, c: kb.add_documents("ok", [], cache=c), "documents"),
        (lambda kb, c: kb.add_documents("ok", "text", cache=c), "documents"),
        (lambda kb, c: kb.add_documents("ok", [{"id": "", "text": "t"}], cache=c), "documents[0].id"),
        (lambda kb, c: kb.add_documents("ok", [{"id": 7, "text": "t"}], cache=c), "documents[0].id"),
        (lambda kb, c: kb.add_documents("ok", [{"id": "x" * 513, "text": "t"}], cache=c), "documents[0].id"),
        (lambda kb, c: kb.add_documents("ok", [{"id": "a", "text": "t"}, {"id": "a", "text": "u"}], cache=c),
         "documents[1].id"),
        (lambda kb, c: kb.add_documents("ok", [{"id": "a", "text": ""}], cache=c), "documents[0].text"),
        (lambda kb, c: kb.add_documents("ok", [{"id": "a", "text": "t", "metadata": [1]}], cache=c),
         "documents[0].metadata"),
        (lambda kb, c: kb.add_documents("ok", [{"id": "a", "text": "t", "metadata": {"x": float("nan")}}], cache=c),
         "documents[0].metadata"),
        (lambda kb, c: kb.add_documents("ok", [{"id": "a", "text": "t", "extra": 1}], cache=c), "documents[0]"),
        (lambda kb, c: kb.delete_documents("ok", []), "ids"),
        (lambda kb, c: kb.delete_documents("ok", "a"), "ids"),
    ],
)
def test_invalid_input_names_the_field(kb, cache, call, field):
    with pytest.raises(InvalidInputError) as info:
        call(kb, cache)
    assert info.value.field == field


def test_milvus_failures_become_tier_unavailable(tmp_path, cache):
    client = open_milvus(str(tmp_path / "closed.db"))
    kb = KnowledgeBase(client)
    kb.add_documents("gone", DOCS[:1], cache=cache)
    client.close()
    for call in (
        lambda: kb.list_collections(),
        lambda: kb.search("gone", "q", cache=cache),
        lambda: kb.add_documents("gone", DOCS[1:2], cache=cache),
        lambda: kb.delete_documents("gone", ["kv"]),
        lambda: kb.collection_info("other"),
    ):
        with pytest.raises(TierUnavailableError, match="Milvus failed"):
            call()


def test_ids_with_quotes_backslashes_and_any_unicode_round_trip(kb, cache):
    name = "odd-ids"
    odd = ["it's", 'say "hi"', "back\\slash", "naïve 🤖", "a,b]' or 1==1", "ñ|Á𝄞4'"]
    kb.add_documents(name, [{"id": doc_id, "text": f"document {doc_id}"} for doc_id in odd], cache=cache)
    again = kb.add_documents(name, [{"id": doc_id, "text": f"document {doc_id} again"} for doc_id in odd], cache=cache)
    assert (again.num_inserted, again.num_replaced) == (0, len(odd))
    found = {hit.id for hit in kb.search(name, "document", cache=cache, top_k=20).hits}
    assert set(odd) <= found
    assert kb.delete_documents(name, odd[:3]) == 3
    assert kb.collection_info(name).num_documents == len(found) - 3


def test_metadata_integers_beyond_64_bits_are_rejected_naming_the_document(kb, cache):
    from ragcache.errors import InvalidInputError

    documents = [{"id": "ok", "text": "fine"}, {"id": "big", "text": "x", "metadata": {"n": [1, {"deep": 1 << 70}]}}]
    with pytest.raises(InvalidInputError, match="64-bit") as info:
        kb.add_documents("big-ints", documents, cache=cache)
    assert info.value.field == "documents[1].metadata"
