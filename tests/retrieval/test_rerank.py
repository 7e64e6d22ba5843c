"""Reranking: the local cross-encoder, the remote API (both shapes, against a real server), the score cache
in real L1/L2, the breaker, and /rerank over real HTTP with the Python client."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import numpy as np
import pytest
import torch

from ragcache import build
from ragcache.client import AsyncClient, Client
from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.core.scope import Scope
from ragcache.errors import InvalidInputError, UpstreamBadResponseError, UpstreamUnavailableError
from ragcache.rerank.local import CrossEncoderReranker
from ragcache.rerank.remote import RemoteReranker
from ragcache.rerank.scores import PairEncoder, RerankCache
from ragcache.retrieval.ranking import SearchOptions
from ragcache.settings import Settings
from ragcache.storage.processes import free_port
from ragcache.storage.stores import Stores
from ragcache.tiers.memory import MemoryTier
from ragcache.tiers.redis import RedisTier
from tests.errors import error_of
from tests.live_server import LiveServer

QUERY = "what does a cross-encoder score?"
TEXTS = ["a pair of texts read together", "bananas are yellow", "relevance of a text to a query", "KV caches", "x"]


@pytest.fixture(scope="module")
def local(tiny_cross_encoder):
    return CrossEncoderReranker(tiny_cross_encoder, device="cpu")


def score_cache(reranker, redis_client=None) -> RerankCache:
    tiers = [MemoryTier(1 << 16, 1, torch.float32)]
    if redis_client is not None:
        tiers.append(RedisTier(redis_client, dim=1, dtype=torch.float32))
    return RerankCache(reranker, EmbeddingCache(PairEncoder(reranker), Levels(tiers, dim=1, dtype=torch.float32, write_behind=False)))


def test_local_scores_are_the_cross_encoders_sorted_best_first(local, tiny_cross_encoder):
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(tiny_cross_encoder, device="cpu", local_files_only=True).predict([(QUERY, t) for t in TEXTS])
    cache = score_cache(local)
    result = cache.rerank(QUERY, TEXTS)
    assert [hit.index for hit in result.hits] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([hit.score for hit in result.hits], np.sort(expected)[::-1], rtol=1e-5)
    assert result.served == {"L1": 0, "compute": len(TEXTS)}
    assert [hit.index for hit in cache.rerank(QUERY, TEXTS, top_n=2).hits] == [hit.index for hit in result.hits[:2]]
    cache.close()


def test_a_repeated_query_reranks_from_l1_then_from_redis_in_another_process(local, redis_client):
    first = score_cache(local, redis_client)
    cold = first.rerank(QUERY, TEXTS)
    warm = first.rerank(QUERY, TEXTS)
    assert warm.hits == cold.hits
    assert warm.served == {"L1": len(TEXTS), "L2": 0, "compute": 0}
    assert first.cache.stats().hits == len(TEXTS)
    # Another process (a fresh L1) sharing Redis: every score from L2, nothing computed.
    second = score_cache(local, redis_client)
    assert second.rerank(QUERY, TEXTS).served == {"L1": 0, "L2": len(TEXTS), "compute": 0}
    # Another query, or another tenant's namespace, is another key: computed.
    assert second.rerank(QUERY + "?", TEXTS).served["compute"] == len(TEXTS)
    assert second.rerank(QUERY, TEXTS, scope=Scope("tenant-b")).served["compute"] == len(TEXTS)
    first.close()
    second.close()


def test_bad_arguments_name_their_field(local):
    cache = score_cache(local)
    with pytest.raises(InvalidInputError) as raised:
        cache.rerank(QUERY, TEXTS, top_n=0)
    assert raised.value.field == "top_n"
    with pytest.raises(InvalidInputError) as raised:
        cache.rerank(QUERY, "not a list")
    assert raised.value.field == "texts"
    cache.close()


def test_the_score_caches_levels_are_the_rows_of_the_table_of_levels_that_keep_scores(local, redis_client):
    # Issue 41.1: a score cache's levels come from ragcache.build.LEVELS, as an embedding cache's do; a level that
    # keeps scores is one more row (its ``scores`` tier), with the row's name, linger and reach.
    settings = Settings(rerank_l1_bytes=1 << 14, redis_ttl_s=600, redis_refresh_ttl_on_hit=True)
    with_redis = build.score_cache(settings, Stores(redis_client, None), local)
    levels = with_redis.cache.levels
    assert levels.names == ("L1", "L2") and levels.shared == 1  # no disk, no Milvus: scores are four bytes
    assert levels.first.figures()["capacity_bytes"] == 1 << 14  # rerank_l1_bytes, not the embeddings' L1
    assert levels.tiers[1].ttl_s == 600 and not levels.tiers[1].refresh_ttl_on_hit
    assert with_redis.rerank(QUERY, TEXTS).served == {"L1": 0, "L2": 0, "compute": len(TEXTS)}
    with_redis.close()
    assert build.score_cache(settings, Stores(None, None), local).cache.levels.names == ("L1",)
    slab = lambda settings, stores, space, device: MemoryTier(1 << 12, space.dim, torch.float32, device=device)  # noqa: E731
    rows = (*build.LEVELS[:1], build.LevelRow("near", "host", slab, scores=slab))
    levels = build.build_levels(settings, Stores(None, None), local.space, torch.device("cpu"), rows=rows, scores=True)
    assert levels.names == ("L1", "near")


@pytest.fixture(scope="module")
def rerank_server(tiny_cross_encoder, tmp_path_factory):
    """ragcache serving the tiny cross-encoder (a real TEI- and Cohere-shaped /rerank on loopback), Milvus Lite
    for /search, and a remote reranker whose endpoint is down (nothing listens on its port)."""
    settings = Settings(
        redis_url="off", data_dir=tmp_path_factory.mktemp("rerank"), rerank_models=[tiny_cross_encoder],
        rerank_url=f"http://127.0.0.1:{free_port()}/rerank", rerank_remote_model="remote-down", rerank_timeout_s=1.0,
    )
    with LiveServer(settings) as live:
        yield live


def test_rerank_route_answers_tei_and_cohere_shapes(rerank_server, local):
    expected = local.score([(QUERY, t) for t in TEXTS])
    order = list(np.argsort(-expected, kind="stable"))
    tei = httpx.post(rerank_server.url + "/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True})
    assert tei.status_code == 200, tei.text
    assert [item["index"] for item in tei.json()] == order
    assert [item["text"] for item in tei.json()] == [TEXTS[i] for i in order]
    np.testing.assert_allclose([item["score"] for item in tei.json()], expected[order], rtol=1e-5)
    cohere = httpx.post(
        rerank_server.url + "/rerank",
        json={"query": QUERY, "documents": [{"text": t} for t in TEXTS], "top_n": 2, "return_documents": True},
    )
    assert cohere.status_code == 200, cohere.text
    body = cohere.json()
    assert [item["index"] for item in body["results"]] == order[:2]
    assert body["results"][0]["document"] == {"text": TEXTS[order[0]]}
    # The TEI call computed these scores; the Cohere call found them all in L1.
    assert cohere.headers["X-Cache-L1"] == "5" and cohere.headers["X-Cache-Compute"] == "0"
    assert body["served"] == {"L1": 5, "compute": 0}


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"query": QUERY, "texts": TEXTS, "model": "no-such-reranker"}, 422, "model"),
        ({"query": QUERY}, 422, "texts"),
        ({"query": QUERY, "texts": TEXTS, "documents": TEXTS}, 422, "documents"),
        ({"query": QUERY, "texts": TEXTS, "top_n": 0}, 422, "top_n"),
        ({"query": QUERY, "texts": TEXTS, "raw_scores": True}, 422, "raw_scores"),
        ({"query": QUERY, "texts": ["word " * 600], "truncate": False}, 413, "texts[0]"),
    ],
)
def test_rerank_route_refuses_bad_input_naming_the_field(rerank_server, body, status, field):
    response = httpx.post(rerank_server.url + "/rerank", json=body)
    assert response.status_code == status, response.text
    assert error_of(response)["field"] == field


def test_stats_count_rerank_hits(rerank_server):
    httpx.post(rerank_server.url + "/rerank", json={"query": "stats", "texts": TEXTS}).raise_for_status()
    httpx.post(rerank_server.url + "/rerank", json={"query": "stats", "texts": TEXTS}).raise_for_status()
    stats = httpx.get(rerank_server.url + "/stats").json()["rerankers"]
    figures = stats[rerank_server.state.settings.rerank.rerank_models[0]]
    metrics = httpx.get(rerank_server.url + "/metrics").text
    assert f'space="{figures["space"]["space_id"]}"' in metrics  # Prometheus counts the score cache too
    assert figures["space"]["dim"] == 1 and figures["space"]["prompt"] == "rerank"
    assert figures["since_start"]["hits"] >= len(TEXTS)


def test_python_clients_rerank(rerank_server, local):
    expected = local.score([(QUERY, t) for t in TEXTS])
    with Client(rerank_server.url) as client:
        result = client.rerank(QUERY, TEXTS, top_n=3)
    assert [hit.index for hit in result.hits] == list(np.argsort(-expected, kind="stable"))[:3]
    assert result.model == rerank_server.state.settings.rerank.rerank_models[0]

    async def rerank_async():
        async with AsyncClient(rerank_server.url) as client:
            return await client.rerank(QUERY, TEXTS, top_n=3)

    assert asyncio.run(rerank_async()).hits == result.hits
    with Client(rerank_server.url) as client, pytest.raises(InvalidInputError) as raised:
        client.rerank(QUERY, TEXTS, model="nope")
    assert raised.value.field == "model"


@pytest.mark.parametrize("api, path", [("tei", "/rerank"), ("cohere", "/rerank")])
def test_remote_reranker_matches_the_local_model_through_a_real_server(rerank_server, local, api, path):
    remote = RemoteReranker(rerank_server.url + path, local.name, api=api, timeout_s=10)
    pairs = [(QUERY, t) for t in TEXTS] + [("another query", t) for t in TEXTS[:2]]
    np.testing.assert_allclose(remote.score(pairs), local.score(pairs), rtol=1e-5)
    remote.close()


def test_remote_reranker_down_opens_the_breaker_and_fails_fast():
    calls = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    remote = RemoteReranker("http://user:s3cret-pw@127.0.0.1:9/rerank", "m", transport=httpx.MockTransport(refuse), retries=1)
    with pytest.raises(UpstreamUnavailableError) as raised:
        remote.score([(QUERY, "t")])
    assert "s3cret-pw" not in str(raised.value) and "127.0.0.1:9" in str(raised.value)
    assert len(calls) == 2  # one retry of a connection that could not be made, no more
    assert remote.health.is_down
    with pytest.raises(UpstreamUnavailableError, match="down"):
        remote.score([(QUERY, "t")])
    assert len(calls) == 2  # the open breaker answered without a network call


def test_remote_reranker_refuses_an_answer_that_misses_a_text():
    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=[{"index": 0, "score": 0.5}])

    remote = RemoteReranker("http://127.0.0.1:9/rerank", "m", transport=httpx.MockTransport(short))
    with pytest.raises(UpstreamBadResponseError, match="misses a text"):
        remote.score([(QUERY, "a"), (QUERY, "b")])


DOCS = [{"id": f"d{n}", "text": text} for n, text in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def collection(rerank_server):
    response = httpx.post(rerank_server.url + "/documents", json={"collection": "rerank_docs", "documents": DOCS}, timeout=60)
    assert response.status_code == 200, response.text
    return "rerank_docs"


def search(server, **body):
    return httpx.post(server.url + "/search", json={"query": QUERY, "collection": "rerank_docs", "top_k": 5, **body}, timeout=60)


@pytest.mark.parametrize("mode", ["dense", "hybrid"])
def test_search_reranks_its_hits_with_the_cross_encoder(rerank_server, collection, local, mode):
    plain = search(rerank_server, mode=mode).json()
    response = search(rerank_server, mode=mode, rerank={"top_n": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    candidates = [hit["text"] for hit in plain["hits"]]
    expected = local.score([(QUERY, text) for text in candidates])
    order = list(np.argsort(-expected, kind="stable"))[:3]
    assert [hit["text"] for hit in body["hits"]] == [candidates[i] for i in order]
    np.testing.assert_allclose([hit["score"] for hit in body["hits"]], expected[order], rtol=1e-5)
    assert body["reranked_by"] == rerank_server.state.settings.rerank.rerank_models[0] and body["rerank_fallback"] is None
    assert response.headers["X-Rerank"] and "X-Rerank-Fallback" not in response.headers
    assert body["timings_ms"]["rerank"] > 0


def test_search_falls_back_to_search_order_when_the_reranker_is_down(rerank_server, collection):
    plain = search(rerank_server).json()
    response = search(rerank_server, rerank={"top_n": 2, "model": "remote-down"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [hit["id"] for hit in body["hits"]] == [hit["id"] for hit in plain["hits"][:2]]
    assert response.headers["X-Rerank-Fallback"] == "search-order"
    assert body["reranked_by"] is None and "remote-down" in body["rerank_fallback"]
    remote = httpx.get(rerank_server.url + "/stats").json()["rerankers"]["remote-down"]["remote"]
    assert remote["up"] is False and remote["num_outages"] >= 1 and "cannot be reached" in remote["last_error"]


@pytest.mark.parametrize(
    "extra, field",
    [({"rerank": {"model": "no-such-reranker"}}, "rerank.model"),
     ({"rerank": {"top_n": 0}}, "rerank.top_n"),
     ({"rerank": {}, "group_by_source": True}, "rerank")],
)
def test_search_refuses_a_rerank_it_cannot_do(rerank_server, collection, extra, field):
    response = search(rerank_server, **extra)
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == field


def test_python_clients_search_with_rerank(rerank_server, collection):
    with Client(rerank_server.url) as client:
        result = client.search(QUERY, "rerank_docs", top_k=5, options=SearchOptions(mode="hybrid"), rerank={"top_n": 2})
        fallback = client.search(QUERY, "rerank_docs", top_k=5, rerank={"model": "remote-down"})
    assert len(result.hits) == 2 and result.reranked_by == rerank_server.state.settings.rerank.rerank_models[0]
    assert result.timings_ms.rerank > 0
    assert fallback.reranked_by is None and fallback.rerank_fallback is not None

    async def search_async():
        async with AsyncClient(rerank_server.url) as client:
            return await client.search(QUERY, "rerank_docs", top_k=5, options=SearchOptions(mode="hybrid"), rerank={"top_n": 2})

    assert [hit.id for hit in asyncio.run(search_async()).hits] == [hit.id for hit in result.hits]
    with Client(rerank_server.url) as client:
        (batched,) = client.search_many([QUERY], "rerank_docs", top_k=5, options=SearchOptions(mode="hybrid"), rerank={"top_n": 2})
    assert batched.hits == result.hits and batched.reranked_by == result.reranked_by


def test_cli_search_with_rerank(rerank_server, collection, capsys):
    from ragcache_cli.cli import main

    assert main(["search", QUERY, "--collection", "rerank_docs", "--top-k", "5", "--rerank", "--rerank-top-n", "2",
                 "--url", rerank_server.url]) == 0
    out = capsys.readouterr().out
    assert "reranked by" in out and " 3. " not in out
    down = ["--rerank", "--rerank-model", "remote-down"]
    assert main(["search", QUERY, "--collection", "rerank_docs", *down, "--url", rerank_server.url]) == 0
    assert "warning: reranker 'remote-down' failed" in capsys.readouterr().out
    assert main(["search", QUERY, "--collection", "rerank_docs", "--rerank-model", "x", "--url", rerank_server.url]) == 1


def test_cli_rerank(rerank_server, local, capsys):
    from ragcache_cli.cli import main

    assert main(["rerank", "cli query", *TEXTS[:3], "--top-n", "2", "--url", rerank_server.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    best = int(np.argmax(local.score([("cli query", text) for text in TEXTS[:3]])))
    assert lines[0].startswith(" 1. ") and f"[{best}]" in lines[0] and len(lines) == 3
    assert main(["rerank", "cli query", *TEXTS[:3], "--url", rerank_server.url]) == 0
    assert "3 of 3 scores from cache" in capsys.readouterr().out
    assert main(["rerank", "q", "t", "--model", "nope", "--url", rerank_server.url]) == 1


def test_batch_search_reranks_each_query(rerank_server, collection, local):
    queries = [QUERY, "bananas"]
    body = {"queries": queries, "collection": "rerank_docs", "top_k": 5, "mode": "hybrid", "rerank": {"top_n": 2}}
    response = httpx.post(rerank_server.url + "/search/batch", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["X-Rerank"]
    for query, result in zip(queries, response.json()["results"]):
        single = search(rerank_server, query=query, mode="hybrid", rerank={"top_n": 2}).json()
        assert [hit["id"] for hit in result["hits"]] == [hit["id"] for hit in single["hits"]]
        assert result["reranked_by"] == single["reranked_by"]
    down = httpx.post(rerank_server.url + "/search/batch", json={**body, "rerank": {"model": "remote-down"}}, timeout=60)
    assert down.status_code == 200 and down.headers["X-Rerank-Fallback"] == "search-order"


@pytest.fixture(scope="module")
def tenant_rerank_server(tiny_cross_encoder, tmp_path_factory):
    """The tiny cross-encoder served with tenants keeping their own cache entries: two tenants' keys."""
    folder = tmp_path_factory.mktemp("rerank-tenants")
    keys = {"keys": [{"name": tenant, "key": f"{tenant}-rerank-key-0123456789", "scopes": ["search"], "tenant": tenant}
                     for tenant in ("acme", "globex")]}
    (folder / "keys.json").write_text(json.dumps(keys))
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=folder, rerank_models=[tiny_cross_encoder],
                        api_keys_file=folder / "keys.json", tenant_cache_namespaces=True)
    with LiveServer(settings) as live:
        yield live


def test_a_tenants_rerank_scores_are_its_own_on_the_service(tenant_rerank_server):
    query_id = uuid.uuid4().hex  # fresh scores for this run

    def rerank(tenant: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {tenant}-rerank-key-0123456789"}
        body = {"query": f"whose scores are these [{query_id}]", "texts": TEXTS}
        return httpx.post(f"{tenant_rerank_server.url}/rerank", json=body, headers=headers, timeout=60)

    first, again, other = rerank("acme"), rerank("acme"), rerank("globex")
    assert first.headers["x-cache-compute"] == str(len(TEXTS))
    assert again.headers["x-cache-l1"] == str(len(TEXTS))  # acme's own scores, from its cache entries
    assert other.headers["x-cache-compute"] == str(len(TEXTS))  # globex cannot use them: computed again
    assert other.json() == first.json()  # the same model, the same scores
