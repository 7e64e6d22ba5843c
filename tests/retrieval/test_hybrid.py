"""Keyword (Milvus BM25) and hybrid search, paging, thresholds, MMR, grouping and batches, against a real
Milvus Lite, a real Redis and the real packaged model. Collections are per test (the database is the session's).
"""

from __future__ import annotations

import pytest
from pymilvus.exceptions import MilvusException

from ragcache.errors import InvalidInputError
from ragcache.retrieval.keyword import SPARSE_FIELD
from ragcache.retrieval.knowledge import KnowledgeBase
from ragcache.retrieval.ranking import SearchOptions
from tests.retrieval.conftest import earlier_collection

DOCS = [
    {"id": "manual.md#0", "text": "Error E4711 means the pump stalled: clear the intake and restart it.",
     "metadata": {"source": "manual.md", "lang": "en"}},
    {"id": "manual.md#1", "text": "The pump stops when the pressure sensor reports a fault.",
     "metadata": {"source": "manual.md", "lang": "en"}},
    {"id": "manual.md#2", "text": "A pump that stops repeatedly needs its pressure sensor checked.",
     "metadata": {"source": "manual.md", "lang": "en"}},
    {"id": "kv", "text": "vLLM keeps the attention keys and values of a prompt prefix in its KV cache.",
     "metadata": {"lang": "en"}},
    {"id": "bread", "text": "Knead the dough for ten minutes and let it rise before baking the bread.",
     "metadata": {"lang": "en"}},
    {"id": "redis", "text": "Redis is an in-memory key-value store often used as a shared cache.",
     "metadata": {"lang": "en"}},
    {"id": "berlin", "text": "Berlin ist die Hauptstadt von Deutschland, mit einer pump station.", "metadata": {"lang": "de"}},
]


@pytest.fixture
def kb(milvus_client):
    return KnowledgeBase(milvus_client)


@pytest.fixture
def loaded(kb, cache, request):
    name = request.node.name.replace("[", "-").replace("]", "")[:60]
    kb.add_documents(name, DOCS, cache=cache)
    return name


def ids(result):
    return [hit.id for hit in result.hits]


def test_keyword_mode_ranks_by_bm25_of_the_exact_term(kb, cache, loaded):
    found = kb.search(loaded, "E4711", cache=cache, top_k=3, options=SearchOptions(mode="keyword"))
    assert ids(found) == ["manual.md#0"]  # BM25 matches the term and nothing else holds it
    assert found.mode == "keyword" and found.fallback is None
    assert found.embedding_level is None  # a keyword search embeds nothing
    assert found.hits[0].score > 0


def test_hybrid_rrf_scores_are_the_sum_over_both_lists(kb, cache, loaded):
    query = "why does the pump stop"
    dense = kb.search(loaded, query, cache=cache, top_k=7)
    keyword = kb.search(loaded, query, cache=cache, top_k=7, options=SearchOptions(mode="keyword"))
    hybrid = kb.search(loaded, query, cache=cache, top_k=7, options=SearchOptions(mode="hybrid"))
    expected: dict[str, float] = {}
    for ranking in (ids(dense), ids(keyword)):
        for rank, doc_id in enumerate(ranking, start=1):
            expected[doc_id] = expected.get(doc_id, 0.0) + 1 / (60 + rank)
    assert {hit.id: hit.score for hit in hybrid.hits} == pytest.approx(expected)
    assert [hit.score for hit in hybrid.hits] == sorted((hit.score for hit in hybrid.hits), reverse=True)
    assert hybrid.mode == "hybrid"


def test_weighted_fusion_at_the_extremes_is_one_list(kb, cache, loaded):
    query = "why does the pump stop"
    keyword = kb.search(loaded, query, cache=cache, top_k=4, options=SearchOptions(mode="keyword"))
    all_keyword = SearchOptions(mode="hybrid", fusion="weighted", dense_weight=0.0)
    fused = kb.search(loaded, query, cache=cache, top_k=len(keyword.hits), options=all_keyword)
    assert ids(fused) == ids(keyword)
    assert fused.hits[0].score == pytest.approx(1.0)


def test_keyword_index_follows_upserts_and_deletes(kb, cache, loaded):
    keyword = SearchOptions(mode="keyword")
    kb.add_documents(loaded, [{"id": "bread", "text": "Sourdough starter E4711 needs flour."}], cache=cache)
    assert set(ids(kb.search(loaded, "E4711", cache=cache, options=keyword))) == {"manual.md#0", "bread"}
    assert ids(kb.search(loaded, "knead dough", cache=cache, options=keyword)) == []  # the old text is gone
    kb.delete_documents(loaded, ["manual.md#0"])
    assert ids(kb.search(loaded, "E4711", cache=cache, options=keyword)) == ["bread"]


@pytest.mark.parametrize("mode", ["dense", "keyword", "hybrid"])
def test_filter_applies_in_every_mode(kb, cache, loaded, mode):
    found = kb.search(loaded, "pump", cache=cache, filter='metadata["lang"] == "de"', options=SearchOptions(mode=mode))
    assert ids(found) == ["berlin"]


@pytest.mark.parametrize("mode", ["dense", "keyword", "hybrid"])
def test_offset_pages_continue_the_ranking(kb, cache, loaded, mode):
    query = "pump pressure sensor cache"
    whole = kb.search(loaded, query, cache=cache, top_k=4, options=SearchOptions(mode=mode))
    second = kb.search(loaded, query, cache=cache, top_k=2, options=SearchOptions(mode=mode, offset=2))
    assert ids(second) == ids(whole)[2:4]


def test_score_threshold_drops_weaker_hits(kb, cache, loaded):
    whole = kb.search(loaded, "pump pressure sensor", cache=cache, top_k=7)
    cut = whole.hits[2].score
    kept = kb.search(loaded, "pump pressure sensor", cache=cache, top_k=7, options=SearchOptions(score_threshold=cut))
    assert ids(kept) == ids(whole)[:3]


def test_mmr_skips_a_near_duplicate(kb, cache, loaded):
    query = "the pump stops and the pressure sensor"
    plain = kb.search(loaded, query, cache=cache, top_k=3)
    assert set(ids(plain)[:2]) == {"manual.md#1", "manual.md#2"}  # the two near-duplicate chunks lead
    relevance_only = kb.search(loaded, query, cache=cache, top_k=3, options=SearchOptions(mmr_lambda=1.0))
    assert ids(relevance_only) == ids(plain)
    diverse = kb.search(loaded, query, cache=cache, top_k=2, options=SearchOptions(mmr_lambda=0.3))
    assert ids(diverse)[0] == ids(plain)[0] and ids(diverse)[1] not in ("manual.md#1", "manual.md#2")


def test_group_by_source_counts_sources(kb, cache, loaded):
    options = SearchOptions(mode="hybrid", group_by_source=True, group_size=2)
    found = kb.search(loaded, "pump pressure sensor", cache=cache, top_k=2, options=options)
    assert found.groups[0].source == "manual.md" and len(found.groups[0].ids) == 2
    assert len(found.groups) == 2 and len(found.groups[1].ids) == 1  # a document without source is its own
    assert ids(found) == [doc_id for group in found.groups for doc_id in group.ids]


def test_batch_search_equals_single_searches(kb, cache, loaded):
    queries = ["E4711", "bread baking", "KV cache of a prompt prefix"]
    options = SearchOptions(mode="hybrid")
    batch = kb.search_many(loaded, queries, cache=cache, top_k=3, options=options)
    singles = [kb.search(loaded, query, cache=cache, top_k=3, options=options) for query in queries]
    assert [ids(r) for r in batch] == [ids(r) for r in singles]
    scores = [h.score for r in batch for h in r.hits]
    assert scores == pytest.approx([h.score for r in singles for h in r.hits])
    with pytest.raises(InvalidInputError) as caught:
        kb.search_many(loaded, ["ok", " "], cache=cache)
    assert caught.value.field == "queries[1]"


def test_result_cache_keys_modes_and_fusion_apart(milvus_client, redis_client, cache, request):
    kb = KnowledgeBase(milvus_client, redis=redis_client)
    kb.add_documents("cached-modes", DOCS, cache=cache)
    first = [kb.search("cached-modes", "pump", cache=cache, options=SearchOptions(mode=mode)) for mode in ("dense", "hybrid")]
    assert [r.result_cache for r in first] == ["miss", "miss"]
    weighted = kb.search("cached-modes", "pump", cache=cache, options=SearchOptions(mode="hybrid", fusion="weighted"))
    assert weighted.result_cache == "miss"
    again = kb.search("cached-modes", "pump", cache=cache, options=SearchOptions(mode="hybrid"))
    assert again.result_cache == "hit" and again.mode == "hybrid" and ids(again) == ids(first[1])


class FailingKeywordMilvus:
    """A Milvus client whose keyword (sparse) searches fail, as a broken keyword index would; all else passes."""

    def __init__(self, milvus):
        self._milvus = milvus

    def search(self, *args, **kwargs):
        if kwargs.get("anns_field") == SPARSE_FIELD:
            raise MilvusException(message="sparse index unavailable (injected)")
        return self._milvus.search(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._milvus, name)


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_a_failing_keyword_index_falls_back_to_dense_and_says_so(milvus_client, redis_client, cache, mode):
    KnowledgeBase(milvus_client).add_documents("kw-failing", DOCS, cache=cache)
    kb = KnowledgeBase(FailingKeywordMilvus(milvus_client), redis=redis_client)
    found = kb.search("kw-failing", "pump", cache=cache, top_k=3, options=SearchOptions(mode=mode))
    dense = kb.search("kw-failing", "pump", cache=cache, top_k=3)
    assert found.mode == "dense" and "injected" in found.fallback
    assert ids(found) == ids(dense)
    again = kb.search("kw-failing", "pump", cache=cache, top_k=3, options=SearchOptions(mode=mode))
    assert again.result_cache == "miss"  # a degraded answer is never served from the result cache


def test_a_collection_without_keyword_index_refuses_keyword_modes(milvus_client, cache):
    """A collection made before the BM25 field existed (the same description, no sparse field)."""
    name = "no-keyword-index"
    earlier_collection(milvus_client, cache, name)
    kb = KnowledgeBase(milvus_client)
    kb.add_documents(name, DOCS[:2], cache=cache)
    assert ids(kb.search(name, "pump", cache=cache, top_k=1)) == ["manual.md#1"]
    with pytest.raises(InvalidInputError) as caught:
        kb.search(name, "pump", cache=cache, options=SearchOptions(mode="hybrid"))
    assert caught.value.field == "mode"


def test_keyword_index_off_makes_dense_only_collections(milvus_client, cache):
    kb = KnowledgeBase(milvus_client, keyword_index=False)
    kb.add_documents("dense-only", DOCS[:2], cache=cache)
    assert ids(kb.search("dense-only", "pump", cache=cache, top_k=1)) == ["manual.md#1"]
    with pytest.raises(InvalidInputError) as caught:
        kb.search("dense-only", "pump", cache=cache, options=SearchOptions(mode="keyword"))
    assert caught.value.field == "mode"
