"""Hostile input against the real service (real Redis, Milvus Lite, model), with its default limits: each is
refused with a clear 4xx or handled, and the service answers normally afterwards."""

import json
import threading
import uuid

import httpx
import pytest

from ragcache.settings import Settings
from tests.errors import error_of
from tests.live_server import LiveServer

MEGABYTE = 1 << 20


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    with LiveServer(Settings(redis_url=redis_server, data_dir=tmp_path_factory.mktemp("hostile"))) as live:
        yield live



@pytest.fixture(scope="module")
def collection(http):
    name = "hostile_" + uuid.uuid4().hex[:8]
    documents = [
        {"id": "a", "text": "alpha document about caches", "metadata": {"group": "g1", "n": 1}},
        {"id": "b", "text": "beta document about search", "metadata": {"group": "g2", "n": 2}},
    ]
    assert http.post("/documents", json={"collection": name, "documents": documents}).status_code == 200
    return name


def post_raw(http, path, body: bytes):
    return http.post(path, content=body, headers={"content-type": "application/json"})


def assert_4xx(response, status=None, field=None):
    assert 400 <= response.status_code < 500, response.text
    if status is not None:
        assert response.status_code == status, response.text
    error = error_of(response)
    assert error["message"] and error["type"]
    if field is not None:
        assert error["field"] == field


def assert_alive(http):
    assert http.get("/health").json()["status"] == "ok"
    assert http.post("/embed", json={"inputs": ["still here"]}).status_code == 200


def test_megabyte_strings_are_refused_by_size(http, collection):
    assert_4xx(http.post("/embed", json={"inputs": "m" * MEGABYTE}), 413, "inputs")
    assert_4xx(http.post("/embed", json={"inputs": ["m" * MEGABYTE]}), 413, "inputs[0]")
    assert_4xx(http.post("/v1/embeddings", json={"input": ["ok", "m" * MEGABYTE]}), 400, "input[1]")  # OpenAI's 400
    assert_4xx(http.post("/search", json={"collection": collection, "query": "q" * MEGABYTE}), 413, "query")
    documents = [{"id": "big", "text": "d" * MEGABYTE}]
    assert_4xx(http.post("/documents", json={"collection": collection, "documents": documents}), 422, "documents[0].text")
    assert_4xx(http.post("/documents", json={"collection": collection, "documents": [{"id": "i" * MEGABYTE, "text": "t"}]}), 422)
    assert_alive(http)


def test_a_body_over_the_default_limit_is_a_413_before_it_is_parsed(http):
    body = b'{"inputs": ["' + b"x" * (17 * MEGABYTE) + b'"]}'
    assert_4xx(post_raw(http, "/embed", body), 413, "body")
    assert_alive(http)


def compact(body) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "path, body, field, limit",
    [
        # 4M ids (16 MB, just under the body limit) were each validated before the 413 for more than max_batch.
        ("/documents/get", {"collection": "c", "ids": ["a"] * 4_000_000}, "ids", "at most 16384 items"),
        ("/tokenize", {"inputs": ["a"] * 40_000}, "inputs", "at most 16384 items"),
        # /decode counted rows, not ids: 8M ids in one row were decoded (18 s, a 200).
        ("/decode", {"ids": [1] * 8_000_000}, "ids", "over the limit of 1048576"),
        ("/decode", {"ids": [[1] * 128] * 8_193}, "ids", "1048704 token ids"),
        ("/decode", {"ids": [[]] * 100_000}, "ids", "100000 lists, over the limit of 16384"),
    ],
)
def test_every_list_is_capped_by_the_schema_before_its_items_are_validated(http, path, body, field, limit):
    response = post_raw(http, path, compact(body))
    assert_4xx(response, 422, field)
    assert limit in error_of(response)["message"]
    assert_alive(http)


@pytest.mark.parametrize("depth", [100, 10_000, 200_000])
def test_deeply_nested_json_is_refused(http, depth):
    body = b'{"inputs": ' + b"[" * depth + b"]" * depth + b"}"
    assert_4xx(post_raw(http, "/embed", body))
    metadata = b'{"k": ' * depth + b"1" + b"}" * depth
    document = b'{"collection": "nested", "documents": [{"id": "x", "text": "t", "metadata": ' + metadata + b"}]}"
    assert_4xx(post_raw(http, "/documents", document))
    assert_alive(http)


def test_metadata_nested_beyond_the_limit_names_the_field(http):
    metadata: dict = {}
    for _ in range(40):
        metadata = {"k": metadata}
    response = http.post("/documents", json={"collection": "nested", "documents": [{"id": "x", "text": "t", "metadata": metadata}]})
    assert_4xx(response, 422, "documents[0].metadata")
    assert "deeper than 32" in error_of(response)["message"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": ["\xff\xfe broken"]}',
        b'{"inputs": ["caf\xc3"]}',
        b'{"inputs": ["\xed\xa0\x80 encoded surrogate"]}',
    ],
)
def test_invalid_utf8_bodies_are_a_400(http, body):
    response = post_raw(http, "/embed", body)
    assert_4xx(response, 400, "body")


def test_nul_bytes_are_texts_like_any_other(http, collection):
    response = http.post("/embed", json={"inputs": ["a\u0000b", "\u0000", "a"]})
    assert response.status_code == 200 and len(response.json()) == 3
    assert response.json()[0] != response.json()[2]  # NUL is part of the text, not an end
    documents = [{"id": "nul\u0000id", "text": "text with a \u0000 inside", "metadata": {"k\u0000": "v\u0000"}}]
    added = http.post("/documents", json={"collection": collection, "documents": documents})
    assert added.status_code in (200, 422), added.text
    found = http.post("/search", json={"collection": collection, "query": "with a \u0000", "top_k": 5})
    assert found.status_code == 200
    assert_4xx(http.post("/search", json={"collection": "bad\u0000name", "query": "x"}), 422, "collection")
    assert_alive(http)


@pytest.mark.parametrize("top_k", [1001, 10**9, 10**30, -1, 0, True, 1.5, "10"])
def test_huge_or_odd_top_k_is_a_422(http, collection, top_k):
    assert_4xx(http.post("/search", json={"collection": collection, "query": "x", "top_k": top_k}), 422, "top_k")


@pytest.mark.parametrize(
    "expression",
    [
        'metadata["group"] == "g1" or true',
        'metadata["group"] == "g1") or (1 == 1',
        'metadata["group"] == "g1\\") or (\\"1\\" == \\"1"',
        'metadata["group\\"] or metadata[\\"x"] == 1',
        'id in ["a", "b"] or pk != ""',
        "vector is not null",
        "kb_other__collection.text == 'x'",
        "1 == 1; drop collection",
        '" + "',
        "(" * 2000 + "true" + ")" * 2000,
        "metadata" + '["k"]' * 1000 + " == 1",
        'metadata["n"] > 99999999999999999999999999999999999',
        "\u0000",
        'text like "%\u0000%"',
    ],
)
def test_filter_expressions_are_handled_or_refused_and_stay_in_their_collection(http, collection, expression):
    response = http.post("/search", json={"collection": collection, "query": "document", "top_k": 10, "filter": expression})
    if response.status_code == 200:
        assert {hit["id"] for hit in response.json()["hits"]} <= {"a", "b", "nul\u0000id"}
    else:
        assert_4xx(response, 422, "filter")


def test_a_filter_over_the_length_limit_is_a_422(http, collection):
    response = http.post("/search", json={"collection": collection, "query": "x", "filter": "n == 1 or " * 1000})
    assert_4xx(response, 422, "filter")


def test_many_hostile_requests_at_once_do_not_crash_a_worker(server, http, collection):
    bodies = [
        b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"inputs": ["\xff"]}',
        json.dumps({"inputs": ["m" * MEGABYTE]}).encode(),
        json.dumps({"collection": collection, "query": "x", "top_k": 10**12}).encode(),
        json.dumps({"collection": collection, "query": "x", "filter": "((((("}).encode(),
        b"null",
        b"[]",
        b'"just a string"',
        b"{" * 10,
    ]
    statuses: list[int] = []

    def fire(body):
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for path in ("/embed", "/search", "/v1/embeddings", "/documents"):
                statuses.append(post_raw(client, path, body).status_code)

    threads = [threading.Thread(target=fire, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(statuses) == 4 * len(bodies) and all(400 <= status < 500 for status in statuses), statuses
    assert_alive(http)
