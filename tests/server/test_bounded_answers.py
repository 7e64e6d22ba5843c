"""Answers that carry documents have a byte bound (RAGCACHE_MAX_ANSWER_BYTES), and searches can ask for hits
without their text: against the real service (real Redis, Milvus Lite and model), with a bound of 256 KiB so
that a few 30 KB documents pass it (the audit's 32 queries x 200 hits over 60 KB documents made 384 MB)."""

from __future__ import annotations

import httpx
import pytest

from ragcache.client import Client
from ragcache.errors import InvalidInputError
from ragcache.settings import Settings
from tests.live_server import LiveServer

MAX_ANSWER_BYTES = 256 * 1024
COLLECTION = "large_docs"
NUM_DOCUMENTS = 20
TEXT_BYTES = 30_000  # 20 hits of it: 600 KB, over the bound; 4 hits: 120 KB, under it


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    settings = Settings(redis_url=redis_server, data_dir=tmp_path_factory.mktemp("answers"), max_answer_bytes=MAX_ANSWER_BYTES)
    with LiveServer(settings) as live:
        words = ["cache", "vector", "search", "token", "prefix"]
        documents = [
            {"id": f"doc{i}", "text": (f"{words[i % 5]} document {i} " * 3000)[:TEXT_BYTES], "metadata": {"n": i}}
            for i in range(NUM_DOCUMENTS)
        ]
        with httpx.Client(base_url=live.url, timeout=120) as http:
            assert http.post("/documents", json={"collection": COLLECTION, "documents": documents}).status_code == 200
        yield live


def assert_answer_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["type"] == "answer_too_large"
    assert f"limit of {MAX_ANSWER_BYTES} bytes (RAGCACHE_MAX_ANSWER_BYTES)" in error["message"]


def test_a_batch_over_the_bound_is_refused_naming_it_and_how_to_ask_for_less(http):
    queries = ["cache question", "vector question", "search question", "token question"]
    response = http.post("/search/batch", json={"collection": COLLECTION, "queries": queries, "top_k": NUM_DOCUMENTS})
    assert_answer_too_large(response)
    assert "include_text: false" in response.json()["error"]["message"]
    # The same batch without the texts: every hit, each with its id, score and metadata and no text.
    response = http.post("/search/batch", json={"collection": COLLECTION, "queries": queries, "top_k": NUM_DOCUMENTS,
                                                "include_text": False})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [len(result["hits"]) for result in results] == [NUM_DOCUMENTS] * 4
    for result in results:
        assert all(set(hit) == {"id", "score", "metadata"} for hit in result["hits"])
        assert {hit["id"] for hit in result["hits"]} == {f"doc{i}" for i in range(NUM_DOCUMENTS)}
        assert result["hits"][0]["metadata"]["n"] == int(result["hits"][0]["id"][3:])
    assert len(response.content) < 16 * 1024


@pytest.mark.parametrize("top_k", [3, 8])  # 3 x 64 KiB cannot pass the bound: the texts come with the hits; 8 could
def test_a_search_within_the_bound_answers_with_texts_as_before(http, top_k):
    response = http.post("/search/batch", json={"collection": COLLECTION, "queries": ["cache question"], "top_k": top_k})
    assert response.status_code == 200, response.text
    hits = response.json()["results"][0]["hits"]
    assert len(hits) == top_k and all(len(hit["text"]) == TEXT_BYTES for hit in hits)
    assert hits == http.post("/search", json={"collection": COLLECTION, "query": "cache question", "top_k": top_k}).json()["hits"]


def test_one_search_has_the_same_bound(http):
    body = {"collection": COLLECTION, "query": "vector question", "top_k": NUM_DOCUMENTS}
    assert_answer_too_large(http.post("/search", json=body))
    response = http.post("/search", json={**body, "include_text": False})
    assert response.status_code == 200, response.text
    assert len(response.json()["hits"]) == NUM_DOCUMENTS and "text" not in response.json()["hits"][0]
    # A result searched without its texts is not cached: the same search with texts still gets them.
    body = {"collection": COLLECTION, "query": "prefix question", "top_k": 8}
    assert "text" not in http.post("/search", json={**body, "include_text": False}).json()["hits"][0]
    response = http.post("/search", json=body)
    assert response.status_code == 200, response.text
    assert [len(hit["text"]) for hit in response.json()["hits"]] == [TEXT_BYTES] * 8


def test_documents_by_id_have_the_same_bound(http):
    ids = [f"doc{i}" for i in range(NUM_DOCUMENTS)]
    response = http.post("/documents/get", json={"collection": COLLECTION, "ids": ids})
    assert_answer_too_large(response)
    assert "fewer ids" in response.json()["error"]["message"]
    response = http.post("/documents/get", json={"collection": COLLECTION, "ids": ids[:4]})
    assert response.status_code == 200 and len(response.json()["documents"]) == 4


def test_the_python_client_asks_for_hits_without_text(server):
    with Client(server.url, timeout=120) as client:
        results = client.search_many(["cache question", "token question"], COLLECTION, top_k=NUM_DOCUMENTS, include_text=False)
        assert [len(result.hits) for result in results] == [NUM_DOCUMENTS, NUM_DOCUMENTS]
        assert all(hit.text == "" and hit.metadata for result in results for hit in result.hits)
        assert client.search("cache question", COLLECTION, top_k=NUM_DOCUMENTS, include_text=False).hits[0].text == ""
        with pytest.raises(InvalidInputError, match="RAGCACHE_MAX_ANSWER_BYTES") as refused:
            client.search_many(["cache question", "token question"], COLLECTION, top_k=NUM_DOCUMENTS)
        assert refused.value.status_code == 413  # type: ignore[attr-defined]
