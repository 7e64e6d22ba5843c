"""Every endpoint over real HTTP, against the real cache: real Redis, real Milvus Lite, the real model."""

import base64
import threading
import uuid

import httpx
import numpy as np
import openai
import pytest
import redis

from ragcache.core.cache import EmbeddingCache
from ragcache.settings import Settings
from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache.tiers import MemoryTier
from tests.errors import error_of
from tests.fakes import HashEncoder
from tests.live_server import LiveServer

MAX_BATCH = 16


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    settings = Settings(redis_url=redis_server, data_dir=tmp_path_factory.mktemp("service"), max_batch=MAX_BATCH)
    with LiveServer(settings) as live:
        yield live


# /health's drift section for the packaged model when its fingerprint has never changed (docs/drift.md).
STABLE = {"sentence-transformers/all-MiniLM-L6-v2": {"generation": 0, "last_drift_at": None, "num_drift_events": 0, "status": "stable"}}


def assert_same_vectors(actual, expected):
    """Served vectors against a fresh computation in this process: the server may have batched the texts
    with others, and a different batch changes float32 rounding in the last bits (padding, matmul blocking)."""
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float32), expected, rtol=1e-4, atol=1e-6)


def fresh(n=3):
    tag = uuid.uuid4().hex[:8]
    return [f"text {i} about caches [{tag}]" for i in range(n)]


def test_embed_computes_then_serves_from_l1_with_cache_headers(http, encoder):
    texts = fresh()
    first = http.post("/embed", json={"inputs": texts, "normalize": False})
    assert first.status_code == 200
    assert first.headers["x-cache-compute"] == "3" and first.headers["x-cache-l1"] == "0"
    again = http.post("/embed", json={"inputs": texts, "normalize": False})
    assert again.headers["x-cache-l1"] == "3" and again.headers["x-cache-hit-rate"] == "1.0000"
    np.testing.assert_array_equal(np.array(again.json(), dtype=np.float32), np.array(first.json(), dtype=np.float32))
    assert_same_vectors(first.json(), encoder.encode(texts).numpy())


def test_embed_single_string_and_normalize(http):
    response = http.post("/embed", json={"inputs": "one text"})
    vectors = np.array(response.json())
    assert vectors.shape == (1, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


def test_empty_string_is_a_valid_text(http):
    response = http.post("/embed", json={"inputs": ["", "x"]})
    assert response.status_code == 200 and len(response.json()) == 2


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"inputs": []}, 422, "inputs"),
        ({"inputs": ["ok", 3]}, 422, "inputs[1]"),
        ({"inputs": 5}, 422, "inputs"),
        ({}, 422, "inputs"),
        ({"inputs": "x", "normalize": "yes"}, 422, "normalize"),
        ({"inputs": "x", "unknown": 1}, 422, "unknown"),
        ({"inputs": ["t"] * (MAX_BATCH + 1)}, 413, "inputs"),
        ({"inputs": ["short", "word " * 400], "truncate": False}, 413, "inputs[1]"),
        ({"inputs": "x", "model": "no-such-model"}, 404, "model"),  # the 404 names what is missing (issue 39.1)
    ],
)
def test_bad_embed_input_is_a_clear_4xx(http, body, status, field):
    response = http.post("/embed", json=body)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["field"] == field and error["message"]
    if status == 404:
        assert "sentence-transformers/all-MiniLM-L6-v2" in error["message"]  # lists the served models


def test_over_long_text_is_truncated_by_default(http):
    assert http.post("/embed", json={"inputs": ["word " * 400]}).status_code == 200


def test_invalid_json_and_lone_surrogates(http):
    response = http.post("/embed", content=b'{"inputs": [', headers={"content-type": "application/json"})
    assert response.status_code == 400 and error_of(response)["type"] == "invalid_json"
    response = http.post("/embed", content=b'{"inputs": ["ok", "\\ud800"]}', headers={"content-type": "application/json"})
    assert response.status_code == 422 and error_of(response)["field"] == "inputs[1]"
    assert "surrogate" in error_of(response)["message"]


def test_openai_client_float_and_base64(server, encoder):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    texts = fresh(2)
    expected = encoder.encode(texts).numpy()
    default = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts)  # base64 on the wire
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    for response in (default, floats):
        assert [d.index for d in response.data] == [0, 1]
        assert_same_vectors([d.embedding for d in response.data], expected)
    assert default.usage.prompt_tokens == sum(encoder.count_tokens(texts)) == default.usage.total_tokens
    assert floats.usage.prompt_tokens == default.usage.prompt_tokens  # the second time from the token memo
    with pytest.raises(openai.BadRequestError, match="dimensions"):  # OpenAI answers 400 for an invalid request
        client.embeddings.create(model="all-MiniLM-L6-v2", input="x", dimensions=128)
    with pytest.raises(openai.NotFoundError, match="served models"):
        client.embeddings.create(model="text-embedding-3-small", input="x")


def test_openai_base64_is_raw_little_endian_float32(http, encoder):
    response = http.post("/v1/embeddings", json={"input": "bytes", "encoding_format": "base64"}).json()
    raw = base64.b64decode(response["data"][0]["embedding"])
    assert_same_vectors(np.frombuffer(raw, dtype="<f4"), encoder.encode(["bytes"]).numpy()[0])
    assert response["object"] == "list" and response["data"][0]["object"] == "embedding"


def test_documents_search_collections_delete(http):
    name = "kb_" + uuid.uuid4().hex[:8]
    documents = [
        {"id": "kv", "text": "A KV cache keeps attention keys and values between decoding steps.", "metadata": {"topic": "llm"}},
        {"id": "fruit", "text": "Bananas are a yellow tropical fruit.", "metadata": {"topic": "food"}},
        {"id": "redis", "text": "Redis is an in-memory key-value store.", "metadata": {"topic": "db"}},
    ]
    added = http.post("/documents", json={"collection": name, "documents": documents})
    assert added.status_code == 200 and added.json()["num_inserted"] == 3
    found = http.post("/search", json={"collection": name, "query": "what does a KV cache keep?", "top_k": 2}).json()
    assert [hit["id"] for hit in found["hits"]][0] == "kv" and len(found["hits"]) == 2
    assert found["embedding_level"] in {"L1", "L2", "L3", "compute"} and found["timings_ms"]["total"] > 0
    filtered = http.post("/search", json={"collection": name, "query": "cache", "filter": 'metadata["topic"] == "food"'}).json()
    assert [hit["id"] for hit in filtered["hits"]] == ["fruit"]
    listed = {c["name"]: c for c in http.get("/collections").json()["collections"]}
    assert listed[name]["num_documents"] == 3 and listed[name]["dim"] == 384
    deleted = http.request("DELETE", "/documents", json={"collection": name, "ids": ["fruit", "nope"]})
    assert deleted.json()["num_deleted"] == 1


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"collection": "no_such_collection", "query": "x"}, 404, "collection"),
        ({"collection": "c", "query": "x", "top_k": 0}, 422, "top_k"),
        ({"collection": "c", "query": 3}, 422, "query"),
        ({"query": "x"}, 422, "collection"),
        ({"collection": "bad name!", "query": "x"}, 422, "collection"),
    ],
)
def test_bad_search_input_is_a_clear_4xx(http, body, status, field):
    response = http.post("/search", json=body)
    assert response.status_code == status, response.text
    assert error_of(response)["field"] == field


def test_bad_filter_is_a_422_naming_filter(http):
    name = "kb_" + uuid.uuid4().hex[:8]
    http.post("/documents", json={"collection": name, "documents": [{"id": "a", "text": "alpha"}]})
    response = http.post("/search", json={"collection": name, "query": "x", "filter": "metadata[[ ==="})
    assert response.status_code == 422 and error_of(response)["field"] == "filter"


def test_a_collection_of_another_space_is_a_409(server, http):
    name = "other_" + uuid.uuid4().hex[:8]
    other = EmbeddingCache(HashEncoder(dim=384), [MemoryTier(1 << 20, 384, __import__("torch").float32)])
    server.state.knowledge.create_collection(name, cache=other)
    response = http.post("/search", json={"collection": name, "query": "x"})
    assert response.status_code == 409 and "space" in error_of(response)["message"]


def test_stats_metrics_health_info(http):
    http.post("/embed", json={"inputs": fresh(2)})
    stats = http.get("/stats").json()
    (entry,) = stats["models"].values()
    overall = entry["since_start"]
    assert overall["texts"] >= 2 and overall["texts_computed"] >= 2
    assert [level["level"] for level in overall["levels"]] == ["L1", "L2", "L3"]
    assert {"lookups", "hits", "misses", "errors", "hit_rate", "latency_p50_ms", "latency_p99_ms"} <= set(overall["levels"][0])
    assert entry["recent"]["period"] == "recent"
    metrics = http.get("/metrics").text
    assert 'ragcache_hits_total{level="L1"' in metrics and "ragcache_hit_ratio" in metrics
    health = http.get("/health").json()
    assert health == {"status": "ok", "levels_down": [], "levels": health["levels"], "drift": STABLE}
    assert list(health["levels"]) == ["L1", "L2", "L3"] and all(level["up"] for level in health["levels"].values())
    info = http.get("/info").json()
    assert info["models"][0]["dim"] == 384 and info["versions"]["torch"].startswith("2.13")
    openapi = http.get("/openapi.json").json()
    embed_responses = openapi["paths"]["/embed"]["post"]["responses"]
    # /embed is TEI's route: its errors are TEI's body (ragcache_server/error_shapes.py).
    assert embed_responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/TEIErrorResponse")
    assert {"400", "404", "413"} <= set(embed_responses)


def test_concurrent_requests_for_one_uncached_text_compute_it_once(server):
    text = f"the same text for everyone [{uuid.uuid4().hex}]"
    before = server.state.caches[server.state.default_model].encoder.stats().num_texts
    barrier = threading.Barrier(32)
    statuses = []

    def request():
        with httpx.Client(base_url=server.url, timeout=60) as client:
            barrier.wait()
            statuses.append(client.post("/embed", json={"inputs": [text]}).status_code)

    threads = [threading.Thread(target=request) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 32
    assert server.state.caches[server.state.default_model].encoder.stats().num_texts - before == 1


def test_redis_failure_makes_the_service_slower_not_broken(tmp_path, encoder):
    redis_server = EmbeddedRedis()
    with LiveServer(Settings(redis_url=redis_server.url, data_dir=tmp_path, redis_timeout_s=0.2)) as live:
        texts = fresh(2)
        assert httpx.post(live.url + "/embed", json={"inputs": texts}).status_code == 200
        redis_server.stop()
        response = httpx.post(live.url + "/embed", json={"inputs": fresh(2), "normalize": False}, timeout=30)
        assert response.status_code == 200
        health = httpx.get(live.url + "/health").json()
        assert health == {"status": "degraded", "levels_down": ["L2"], "levels": health["levels"], "drift": STABLE}


def test_graceful_shutdown_flushes_queued_writes(redis_url, tmp_path):
    texts = fresh(40)
    with LiveServer(Settings(redis_url=redis_url, data_dir=tmp_path)) as live:
        assert httpx.post(live.url + "/embed", json={"inputs": texts}, timeout=60).status_code == 200
        keys = live.state.caches[live.state.default_model].space.keys(texts)
    # The server has stopped: every write it accepted must be in Redis.
    client = redis.Redis.from_url(redis_url)
    assert client.exists(*keys) == len(keys)


def test_python_client_against_the_server(server, encoder):
    from ragcache.client import AsyncClient, Client
    from ragcache.errors import InvalidInputError, NotFoundError

    name = "client_" + uuid.uuid4().hex[:8]
    texts = fresh(3)
    with Client(server.url) as client:
        assert_same_vectors(client.embed(texts), encoder.encode(texts).numpy())
        added = client.add_documents(name, [{"id": "kv", "text": "A KV cache keeps attention keys and values."},
                                            {"id": "sky", "text": "The sky is blue on a clear day."}])
        assert added.num_received == 2
        result = client.search("what does a KV cache keep?", collection=name, top_k=1)
        assert result.hits[0].id == "kv" and result.hits[0].score > 0
        assert name in {c.name for c in client.collections()}
        assert client.stats()["models"]
        with pytest.raises(NotFoundError, match="does not exist"):
            client.search("x", collection="missing_collection")
        with pytest.raises(InvalidInputError):
            client.embed([])

    async def use_async():
        async with AsyncClient(server.url) as client:
            return await client.embed(texts)

    import asyncio

    assert_same_vectors(asyncio.run(use_async()), encoder.encode(texts).numpy())


def test_langchain_adapter_against_the_server(server, encoder):
    from ragcache.client import Client
    from ragcache.integrations.langchain import RagCacheEmbeddings

    embeddings = RagCacheEmbeddings(Client(server.url))
    vectors = embeddings.embed_documents(["alpha", "beta"])
    assert_same_vectors(vectors, encoder.encode(["alpha", "beta"]).numpy())
    assert len(embeddings.embed_query("alpha")) == 384


def test_repeated_search_is_served_from_the_result_cache_until_an_ingest(http):
    name = "rc_" + uuid.uuid4().hex[:8]
    http.post("/documents", json={"collection": name, "documents": [{"id": "a", "text": "alpha particles"}]})
    body = {"collection": name, "query": "alpha", "top_k": 3}
    first, second = http.post("/search", json=body).json(), http.post("/search", json=body).json()
    assert (first["result_cache"], second["result_cache"]) == ("miss", "hit")
    assert second["hits"] == first["hits"] and second["embedding_level"] is None
    http.post("/documents", json={"collection": name, "documents": [{"id": "b", "text": "alpha decay"}]})
    third = http.post("/search", json=body).json()
    assert third["result_cache"] == "miss" and {hit["id"] for hit in third["hits"]} == {"a", "b"}


def test_search_with_a_prompt_prefix_answers_the_assembled_prompt(http):
    name = "pp_" + uuid.uuid4().hex[:8]
    documents = [{"id": "b-redis", "text": "Redis keeps keys in memory."},
                 {"id": "a-kv", "text": "A KV cache keeps attention keys and values."}]
    http.post("/documents", json={"collection": name, "documents": documents})
    system = "Answer from the context only.\n"
    # Registration works while its vLLM target is down (nothing listens there).
    registered = http.post("/prefixes", json={"name": name, "text": system, "pinned": False,
                                              "target": {"base_url": "http://127.0.0.1:9", "model": "m"}})
    assert registered.status_code == 201
    body = {"collection": name, "query": "what keeps keys?", "top_k": 2, "prompt_prefix": name}
    for _ in range(2):  # computed, then from the result cache: the same prompt both times
        found = http.post("/search", json=body).json()
        assert found["prompt"] == (system + "[a-kv] A KV cache keeps attention keys and values.\n"
                                   "[b-redis] Redis keeps keys in memory.\nQuestion: what keeps keys?\n")
    custom = http.post("/search", json={**body, "prompt_volatile": "Today: Monday. Q?"}).json()
    assert custom["prompt"].endswith("memory.\nToday: Monday. Q?")
    assert "prompt" not in http.post("/search", json={k: v for k, v in body.items() if k != "prompt_prefix"}).json()
    missing = http.post("/search", json={**body, "prompt_prefix": "no-such-prefix"})
    assert missing.status_code == 404
    newline = http.post("/search", json={**body, "prompt_prefix": name + "\n"})
    assert newline.status_code == 422 and error_of(newline)["field"] == "prompt_prefix"
    assert http.get(f"/prefixes/{name}/stats").json()["num_uses"] == 3
