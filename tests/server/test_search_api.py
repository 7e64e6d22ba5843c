"""/search modes, fusion, paging and batches over real HTTP (real Redis, Milvus Lite and model), through the
Python clients (sync and async) and the CLI, and the fallback to dense when the keyword index fails."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from ragcache.client import AsyncClient, Client, SearchOptions
from ragcache.retrieval.knowledge import KnowledgeBase
from ragcache.settings import Settings
from ragcache_cli.cli import main
from tests.errors import error_of
from tests.live_server import LiveServer
from tests.retrieval.test_hybrid import DOCS, FailingKeywordMilvus

COLLECTION = "api_hybrid"


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    with LiveServer(Settings(redis_url=redis_server, data_dir=tmp_path_factory.mktemp("search-api"))) as live:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            assert http.post("/documents", json={"collection": COLLECTION, "documents": DOCS}).status_code == 200
        yield live


def search(http, **body):
    response = http.post("/search", json={"collection": COLLECTION, **body})
    assert response.status_code == 200, response.text
    return response


@pytest.mark.parametrize("mode", ["dense", "keyword", "hybrid"])
def test_each_mode_answers_and_names_itself(http, mode):
    response = search(http, query="E4711 pump", mode=mode, top_k=3)
    assert response.headers["x-search-mode"] == mode and "x-search-fallback" not in response.headers
    payload = response.json()
    assert payload["mode"] == mode and payload["fallback"] is None
    if mode != "dense":
        assert payload["hits"][0]["id"] == "manual.md#0"


def test_hybrid_options_travel_and_key_the_result_cache(http):
    body = {"query": "pump pressure", "mode": "hybrid", "fusion": "weighted", "dense_weight": 0.3, "top_k": 2}
    first, again = search(http, **body).json(), search(http, **body).json()
    assert again["result_cache"] == "hit" and [h["id"] for h in again["hits"]] == [h["id"] for h in first["hits"]]
    other = search(http, **{**body, "dense_weight": 0.7}).json()
    assert other["result_cache"] == "miss"


def test_paging_grouping_and_threshold(http):
    whole = search(http, query="pump pressure sensor", mode="hybrid", top_k=4).json()["hits"]
    page = search(http, query="pump pressure sensor", mode="hybrid", top_k=2, offset=2).json()["hits"]
    assert [h["id"] for h in page] == [h["id"] for h in whole[2:4]]
    grouped = search(http, query="pump pressure sensor", group_by_source=True, group_size=3, top_k=1).json()
    assert grouped["groups"] == [{"source": "manual.md", "ids": [h["id"] for h in grouped["hits"]]}]
    assert search(http, query="pump", score_threshold=1.5).json()["hits"] == []  # cosine never exceeds 1


def test_batch_search_answers_each_query_in_order(http):
    response = http.post("/search/batch", json={"collection": COLLECTION, "queries": ["E4711", "bread dough"],
                                                "mode": "keyword", "top_k": 1})
    assert response.status_code == 200
    assert [r["hits"][0]["id"] for r in response.json()["results"]] == ["manual.md#0", "bread"]


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/search", {"query": "x", "mode": "sparse"}, "mode"),
        ("/search", {"query": "x", "fusion": "max"}, "fusion"),
        ("/search", {"query": "x", "offset": -1}, "offset"),
        ("/search", {"query": "x", "mmr_lambda": 2}, "mmr_lambda"),
        ("/search", {"query": "x", "dense_weight": "half"}, "dense_weight"),
        ("/search", {"query": "x", "group_size": 0}, "group_size"),
        ("/search/batch", {"queries": []}, "queries"),
        ("/search/batch", {"queries": ["ok", "  "]}, "queries[1]"),
    ],
)
def test_bad_search_options_are_422_naming_the_field(http, path, body, field):
    response = http.post(path, json={"collection": COLLECTION, **body})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_python_clients_and_cli_search_every_mode(server, capsys):
    options = SearchOptions(mode="hybrid", group_by_source=True)
    with Client(server.url) as client:
        result = client.search("E4711", COLLECTION, top_k=2, options=options)
        batch = client.search_many(["E4711", "bread dough"], COLLECTION, top_k=1, options=SearchOptions(mode="keyword"))
    assert result.mode == "hybrid" and result.hits[0].id == "manual.md#0" and result.groups[0].source == "manual.md"
    assert [r.hits[0].id for r in batch] == ["manual.md#0", "bread"]

    async def run():
        async with AsyncClient(server.url) as client:
            return await client.search("E4711", COLLECTION, top_k=1, options=SearchOptions(mode="keyword"))

    assert asyncio.run(run()).hits[0].id == "manual.md#0"
    assert main(["search", "E4711", "--collection", COLLECTION, "--mode", "keyword", "--top-k", "1", "--url", server.url]) == 0
    out = capsys.readouterr().out
    assert "manual.md#0" in out and "keyword" in out
    grouped = ["search", "pump pressure", "--collection", COLLECTION, "--group-by-source", "--group-size", "3", "--top-k", "1"]
    assert main([*grouped, "--url", server.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == " 1. manual.md" and all("manual.md#" in line for line in lines[1:-1])


def test_failing_keyword_index_falls_back_to_dense_with_header(redis_server, tmp_path):
    with LiveServer(Settings(redis_url=redis_server, data_dir=tmp_path)) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        assert http.post("/documents", json={"collection": "fb", "documents": DOCS}).status_code == 200
        state = live.state
        # The fault goes in through the knowledge base's constructor: its Milvus client fails sparse searches.
        state.deployment.knowledge = KnowledgeBase(FailingKeywordMilvus(state.knowledge.milvus), redis=state.stores.redis)
        response = http.post("/search", json={"collection": "fb", "query": "pump", "mode": "hybrid", "top_k": 2})
        assert response.status_code == 200
        assert response.headers["x-search-fallback"] == "dense" and response.headers["x-search-mode"] == "dense"
        assert "keyword search failed" in response.json()["fallback"]
        with Client(live.url) as client:
            assert client.search("pump", "fb", options=SearchOptions(mode="keyword")).fallback is not None


def test_a_model_without_prompts_behaves_as_before(http):
    """This server configures no prompts: an input_type changes nothing, a prompt_name is unknown (422)."""
    plain = http.post("/embed", json={"inputs": ["pump"]})
    typed = http.post("/embed", json={"inputs": ["pump"], "input_type": "search_query"})
    assert typed.status_code == 200 and typed.json() == plain.json()
    named = http.post("/embed", json={"inputs": ["pump"], "prompt_name": "query"})
    assert named.status_code == 422 and error_of(named)["field"] == "prompt_name"
    assert "no prompt named 'query'" in error_of(named)["message"]


def test_get_documents_by_id_in_the_order_asked(http, server):
    response = http.post("/documents/get", json={"collection": COLLECTION, "ids": ["kv", "nope", "manual.md#1", "kv"]})
    assert response.status_code == 200
    payload = response.json()
    assert [d["id"] for d in payload["documents"]] == ["kv", "manual.md#1"] and payload["missing"] == ["nope"]
    assert payload["documents"][1] == {k: DOCS[1][k] for k in ("id", "text", "metadata")}

    async def run():
        async with AsyncClient(server.url) as client:
            return await client.get_documents(COLLECTION, ["bread"])

    assert [d.text for d in asyncio.run(run())] == [DOCS[4]["text"]]


def test_drop_collection(http, server):
    from ragcache.errors import NotFoundError

    assert http.post("/documents", json={"collection": "to-drop", "documents": DOCS[:2]}).status_code == 200
    assert http.delete("/collections/to-drop").json() == {"collection": "to-drop", "dropped": True}
    assert http.post("/search", json={"collection": "to-drop", "query": "pump"}).status_code == 404
    assert http.delete("/collections/to-drop").status_code == 404
    bad = http.delete("/collections/no%20spaces")
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "collection"
    with Client(server.url) as client:
        client.add_documents("to-drop-2", DOCS[:1])
        client.drop_collection("to-drop-2")
        with pytest.raises(NotFoundError):
            client.drop_collection("to-drop-2")
        assert "to-drop-2" not in [c.name for c in client.collections()]
