"""Client logic over ``httpx.MockTransport``: request shapes, base64 decoding, retries, error mapping.

The handlers here stand in for the service at the transport seam; tests against the real service live
with the service.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import httpx
import numpy as np
import pytest

from ragcache.client import (
    AsyncClient,
    AuthenticationError,
    Client,
    ServiceError,
    ServiceUnavailableError,
)
from ragcache.errors import ConflictError, InvalidInputError, NotFoundError, RagCacheError
from ragcache.retrieval.documents import Document
from ragcache.retrieval.results import CollectionInfo, IngestResult, SearchHit, SearchResult, SearchTimings

VECTORS = np.array([[0.5, -1.25, 3.0e-7, 1e30], [1.0, 2.0, -0.0, np.pi]], dtype=np.float32)


def b64(vector: np.ndarray) -> str:
    return base64.b64encode(vector.astype("<f4").tobytes()).decode()


def embeddings_answer(vectors: np.ndarray, *, encode=b64) -> dict:
    # Out of order on purpose: the client must place each vector by its index.
    data = [{"object": "embedding", "embedding": encode(v), "index": i} for i, v in enumerate(vectors)][::-1]
    return {"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 3, "total_tokens": 3}}


class Recorder:
    """A handler that answers from a list of outcomes (a response, or an exception to raise) and keeps requests."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def body(self, position: int = -1) -> dict:
        return json.loads(self.requests[position].content)


def client_for(handler, **options) -> Client:
    options.setdefault("backoff_s", 0.0)
    return Client("http://ragcache.test", transport=httpx.MockTransport(handler), **options)


def error(status: int, message: str = "boom", field: str | None = None, kind: str = "error") -> httpx.Response:
    return httpx.Response(status, json={"error": {"type": kind, "message": message, "field": field}})


# ---- requests and answers -------------------------------------------------------------------------------


def test_embed_sends_base64_request_and_decodes_little_endian_float32():
    handler = Recorder(httpx.Response(200, json=embeddings_answer(VECTORS)))
    with client_for(handler, api_key="k3y", model="all-MiniLM-L6-v2") as client:
        vectors = client.embed(["a", "b"])
    assert vectors.dtype == np.float32 and vectors.shape == (2, 4)
    np.testing.assert_array_equal(vectors, VECTORS)
    request = handler.requests[0]
    assert (request.method, request.url.path) == ("POST", "/v1/embeddings")
    assert request.headers["authorization"] == "Bearer k3y"
    assert handler.body() == {"input": ["a", "b"], "encoding_format": "base64", "model": "all-MiniLM-L6-v2"}


def test_the_model_goes_with_search_and_ingest():
    handler = Recorder(httpx.Response(400, json={"error": {"message": "stop here"}}))
    with client_for(handler, model="other-model") as client:
        for call in (lambda: client.search("q", "docs"), lambda: client.add_documents("docs", [])):
            with pytest.raises(InvalidInputError):
                call()
    assert [json.loads(r.content)["model"] for r in handler.requests] == ["other-model", "other-model"]


def test_embed_accepts_a_single_string_and_float_lists():
    handler = Recorder(httpx.Response(200, json=embeddings_answer(VECTORS[:1], encode=lambda v: v.tolist())))
    with client_for(handler) as client:
        vectors = client.embed("a")
    np.testing.assert_array_equal(vectors, VECTORS[:1])
    assert handler.body() == {"input": ["a"], "encoding_format": "base64"}
    assert "authorization" not in handler.requests[0].headers


def test_base_url_path_prefix_is_kept():
    handler = Recorder(httpx.Response(200, json={"status": "ok"}))
    with Client("http://ragcache.test/prefix", transport=httpx.MockTransport(handler)) as client:
        assert client.health() == {"status": "ok"}
    assert handler.requests[0].url.path == "/prefix/health"


def test_search_reads_the_library_result_shape():
    expected = SearchResult(
        hits=(SearchHit("kv", 0.91, "KV caches hold keys", {"lang": "en"}), SearchHit("b", 0.2, "bread", {})),
        embedding_level="L2",
        timings_ms=SearchTimings(embed=0.4, search=2.5, total=3.1),
        result_cache="miss",
    )
    handler = Recorder(httpx.Response(200, json=dataclasses.asdict(expected)))
    with client_for(handler) as client:
        found = client.search("what is a kv cache", "docs", top_k=2, filter='metadata["lang"] == "en"')
    assert found == expected
    assert handler.body() == {
        "query": "what is a kv cache", "collection": "docs", "top_k": 2, "filter": 'metadata["lang"] == "en"',
    }


def test_documents_collections_and_stats():
    ingest = IngestResult("docs", 2, 1, 1, 0, 2, {"L1": 0, "compute": 2})
    info = CollectionInfo("docs", "abc123", "sentence-transformers/all-MiniLM-L6-v2", 384, 2)
    handler = Recorder(
        httpx.Response(200, json={**dataclasses.asdict(ingest), "added_by_a_newer_server": True}),
        httpx.Response(200, json={"collection": "docs", "num_deleted": 1}),
        httpx.Response(200, json={"collections": [dataclasses.asdict(info)]}),
        httpx.Response(200, json={"hit_rate": 0.5}),
    )
    with client_for(handler) as client:
        documents = [Document("a", "alpha", {"k": 1}), {"id": "b", "text": "beta"}]
        assert client.add_documents("docs", documents) == ingest
        assert client.delete_documents("docs", ("a",)) == 1
        assert client.collections() == [info]
        assert client.stats() == {"hit_rate": 0.5}
    assert handler.body(0) == {
        "collection": "docs",
        "documents": [{"id": "a", "text": "alpha", "metadata": {"k": 1}}, {"id": "b", "text": "beta"}],
    }
    assert (handler.requests[1].method, handler.requests[1].url.path) == ("DELETE", "/documents")
    assert handler.body(1) == {"collection": "docs", "ids": ["a"]}
    assert [r.url.path for r in handler.requests[2:]] == ["/collections", "/stats"]


# ---- retries ----------------------------------------------------------------------------------------------


def test_connect_errors_are_retried_then_succeed():
    handler = Recorder(httpx.ConnectError("refused"), httpx.ConnectTimeout("slow"),
                       httpx.Response(200, json=embeddings_answer(VECTORS)))
    with client_for(handler, retries=2) as client:
        np.testing.assert_array_equal(client.embed(["a", "b"]), VECTORS)
    assert len(handler.requests) == 3


def test_connect_errors_after_the_retries_are_service_unavailable():
    handler = Recorder(httpx.ConnectError("refused"))
    with client_for(handler, retries=1) as client, pytest.raises(ServiceUnavailableError, match="cannot be reached"):
        client.embed(["a"])
    assert len(handler.requests) == 2


def test_502_and_503_are_retried_and_the_last_message_kept():
    handler = Recorder(error(503, "warming up"), error(502, "bad gateway"), error(503, "still warming up"))
    with client_for(handler, retries=2) as client, pytest.raises(ServiceUnavailableError) as info:
        client.health()
    assert len(handler.requests) == 3
    assert str(info.value) == "still warming up" and info.value.status_code == 503


def test_429_waits_for_retry_after_then_succeeds():
    limited = httpx.Response(429, headers={"Retry-After": "0.05"}, json={"error": {"type": "rate_limited", "message": "slow down"}})
    handler = Recorder(limited, httpx.Response(200, json=embeddings_answer(VECTORS)))
    with client_for(handler, retries=1) as client:
        np.testing.assert_array_equal(client.embed(["a", "b"]), VECTORS)
    assert len(handler.requests) == 2


def test_429_after_the_retries_is_service_unavailable_with_its_status():
    handler = Recorder(error(429, "rate limit of key 'app' exceeded"))
    with client_for(handler, retries=1) as client, pytest.raises(ServiceUnavailableError, match="rate limit") as info:
        client.embed(["a"])
    assert len(handler.requests) == 2 and info.value.status_code == 429


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 422, 500, 504])
def test_other_statuses_are_never_retried(status):
    handler = Recorder(error(status))
    with client_for(handler, retries=3) as client, pytest.raises(RagCacheError):
        client.search("q", "docs")
    assert len(handler.requests) == 1


def test_a_read_timeout_is_not_retried():
    handler = Recorder(httpx.ReadTimeout("slow"))
    with client_for(handler, retries=3) as client, pytest.raises(ServiceUnavailableError, match="timed out"):
        client.search("q", "docs")
    assert len(handler.requests) == 1


def test_backoff_doubles_per_attempt():
    client = Client(retries=3, backoff_s=0.1, transport=httpx.MockTransport(Recorder(error(500))))
    refused = httpx.ConnectError("refused")
    assert [client._retry_delay(attempt, refused) for attempt in range(4)] == [0.1, 0.2, 0.4, None]
    assert client._retry_delay(0, httpx.Response(503)) == 0.1
    assert client._retry_delay(0, httpx.Response(429)) == 0.1
    assert client._retry_delay(0, httpx.Response(429, headers={"Retry-After": "2"})) == 2.0
    assert client._retry_delay(2, httpx.Response(503, headers={"Retry-After": "0.01"})) == 0.4
    assert client._retry_delay(0, httpx.Response(429, headers={"Retry-After": "3600"})) is None


# ---- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, InvalidInputError),
        (413, InvalidInputError),
        (422, InvalidInputError),
        (404, NotFoundError),
        (409, ConflictError),
        (403, AuthenticationError),
        (504, ServiceUnavailableError),
        (500, ServiceError),
        (418, ServiceError),
    ],
)
def test_statuses_map_to_the_library_errors_with_the_server_message(status, kind):
    handler = Recorder(error(status, "the server's words", field="top_k"))
    with client_for(handler) as client, pytest.raises(kind) as info:
        client.search("q", "docs")
    assert str(info.value) == "the server's words"
    assert info.value.status_code == status
    if isinstance(info.value, InvalidInputError):
        assert info.value.field == "top_k"


@pytest.mark.parametrize("api_key, advice", [
    (None, "sent none: pass Client(api_key=...)"),
    ("wrong-key", "refused this client's API key (401): check the key given as Client(api_key=...)"),
])
def test_a_401_says_how_this_client_passes_a_key(api_key, advice):
    """The service's 401 advises an HTTP header, which a client user never writes: the client names its own way."""
    handler = Recorder(httpx.Response(401, json={"error": {"type": "unauthorized", "field": None,
                                                           "message": "missing or wrong API key: send 'Authorization: Bearer <key>'"}}))
    with client_for(handler, api_key=api_key) as client, pytest.raises(AuthenticationError) as info:
        client.search("q", "docs")
    assert advice in str(info.value) and "RAGCACHE_API_KEY" in str(info.value)
    assert "Authorization" not in str(info.value) and info.value.status_code == 401


@pytest.mark.parametrize("field", ["collection", "model", None])
def test_a_404_carries_the_field_it_names(field):
    """A missing collection (an empty store to the adapters) is told from a model the service does not serve."""
    handler = Recorder(error(404, "not there", field=field))
    with client_for(handler) as client, pytest.raises(NotFoundError) as info:
        client.search("q", "docs")
    assert info.value.field == field and str(info.value) == "not there"


def test_embed_sends_the_input_type_only_when_asked():
    handler = Recorder(httpx.Response(200, json=embeddings_answer(VECTORS)))
    with client_for(handler) as client:
        client.embed(["a", "b"], input_type="query")
        client.embed(["a", "b"])
    bodies = [json.loads(request.content) for request in handler.requests]
    assert bodies[0]["input_type"] == "query" and "input_type" not in bodies[1] and "prompt_name" not in bodies[1]


@pytest.mark.parametrize("body, field", [
    ({"error": {"message": "the server's words", "type": "invalid_request_error", "param": "input", "code": None}}, "input"),
    ({"error": {"message": "the server's words", "type": "invalid_request_error", "param": "input", "field": "input"}}, "input"),
    ({"error": "the server's words", "error_type": "Validation"}, None),
])
def test_openai_and_tei_error_bodies_keep_the_message_and_field(body, field):
    handler = Recorder(httpx.Response(400, json=body))
    with client_for(handler) as client, pytest.raises(InvalidInputError) as info:
        client.embed(["a"])
    assert str(info.value) == "the server's words" and info.value.field == field


def test_fastapi_validation_detail_names_the_field():
    detail = [{"loc": ["body", "top_k"], "msg": "Input should be less than or equal to 1000", "type": "x"}]
    handler = Recorder(httpx.Response(422, json={"detail": detail}))
    with client_for(handler) as client, pytest.raises(InvalidInputError) as info:
        client.search("q", "docs", top_k=5000)
    assert info.value.field == "top_k"
    assert "less than or equal to 1000" in str(info.value)


def test_a_plain_text_error_body_is_the_message():
    handler = Recorder(httpx.Response(500, text="Internal Server Error"))
    with client_for(handler) as client, pytest.raises(ServiceError, match="^Internal Server Error$"):
        client.stats()


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, text="not json"),
        httpx.Response(200, json={"data": [{"embedding": "!!not base64!!", "index": 0}]}),
        httpx.Response(200, json={"data": []}),  # no vector for the one text
        httpx.Response(200, json=[1, 2]),
    ],
)
def test_an_unexpected_answer_is_a_service_error(answer):
    with client_for(Recorder(answer)) as client, pytest.raises(ServiceError, match="unexpected answer"):
        client.embed(["a"])


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("x"),
        httpx.ReadTimeout("x"),
        httpx.PoolTimeout("x"),
        httpx.RemoteProtocolError("x"),
        httpx.ReadError("x"),
        httpx.WriteError("x"),
        httpx.UnsupportedProtocol("x"),
    ],
)
def test_no_httpx_exception_escapes_unconverted(failure):
    with client_for(Recorder(failure)) as client, pytest.raises(RagCacheError) as info:
        client.collections()
    assert isinstance(info.value.__cause__, httpx.HTTPError)


def test_a_body_json_cannot_hold_is_invalid_input():
    handler = Recorder(httpx.Response(200, json={}))
    with client_for(handler) as client, pytest.raises(InvalidInputError, match="not valid JSON"):
        client.add_documents("docs", [{"id": "a", "text": "t", "metadata": {"when": object()}}])
    assert handler.requests == []


# ---- async ----------------------------------------------------------------------------------------------------


async def test_async_client_embeds_retries_and_maps_errors():
    handler = Recorder(
        httpx.ConnectError("refused"),
        httpx.Response(200, json=embeddings_answer(VECTORS)),
        error(404, "collection 'x' does not exist"),
    )
    async with AsyncClient("http://ragcache.test", transport=httpx.MockTransport(handler), backoff_s=0.0,
                           api_key="k") as client:
        np.testing.assert_array_equal(await client.embed(["a", "b"]), VECTORS)
        with pytest.raises(NotFoundError, match="'x' does not exist"):
            await client.search("q", "x")
    assert len(handler.requests) == 3
    assert handler.requests[1].headers["authorization"] == "Bearer k"


# ---- LangChain -----------------------------------------------------------------------------------------------


def test_langchain_embeddings_sync_and_async():
    # langchain-core comes with `make test` (the langchain extra): a missing one must fail, not skip.
    from ragcache.integrations.langchain import RagCacheEmbeddings

    def answer(request: httpx.Request) -> httpx.Response:
        texts = json.loads(request.content)["input"]
        return httpx.Response(200, json=embeddings_answer(VECTORS[: len(texts)]))

    sync_client = client_for(answer)
    async_client = AsyncClient("http://ragcache.test", transport=httpx.MockTransport(answer))
    embeddings = RagCacheEmbeddings(sync_client, async_client=async_client)
    expected = VECTORS.tolist()
    assert embeddings.embed_documents(["a", "b"]) == expected
    assert embeddings.embed_query("a") == expected[0]
    assert embeddings.embed_documents([]) == []

    async def run():
        only_sync = RagCacheEmbeddings(sync_client)  # a* methods fall back to a worker thread
        return (
            await embeddings.aembed_documents(["a", "b"]),
            await embeddings.aembed_query("a"),
            await only_sync.aembed_query("a"),
        )

    try:
        assert asyncio.run(run()) == (expected, expected[0], expected[0])
    finally:
        sync_client.close()
        asyncio.run(async_client.aclose())
