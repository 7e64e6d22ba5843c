"""The embedding routes' fast path (ragcache_server/embedding/answers.py) against the real service: it is taken for the three
routes, it answers what the FastAPI routes answered (bytes, errors), and it keeps every check of the middleware
outside it: a key without the ``embed`` scope, a key over its rate, a body over the bound never reach it."""

from __future__ import annotations

import base64
import hashlib
import json

import httpx
import numpy as np
import orjson
import pytest

from ragcache.settings import Settings
from ragcache_server.embedding import answers
from ragcache_server.embedding.answers import openai_base64_answer
from tests.errors import error_of
from tests.live_server import LiveServer

KEYS = {"embedder": "embed-only-key-0123456789", "searcher": "search-only-key-0123456789",
        "metered": "metered-embed-key-0123456789"}
TEXTS = ["What is a KV cache?", "Milvus stores vectors", "ünïcödé text 字"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fast-path")
    sha = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    keys = {"keys": [{"name": "embedder", "sha256": sha(KEYS["embedder"]), "scopes": ["embed"]},
                     {"name": "searcher", "sha256": sha(KEYS["searcher"]), "scopes": ["search"]},
                     {"name": "metered", "sha256": sha(KEYS["metered"]), "scopes": ["embed"], "rate_limit_per_s": 0.01,
                      "rate_limit_burst": 2}]}
    (folder / "keys.json").write_text(json.dumps(keys))
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=folder, api_keys_file=folder / "keys.json", max_batch=8)
    with LiveServer(settings) as live:
        yield live


def post(server, path: str, body, key: str = "embedder", **headers) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEYS[key]}", "content-type": "application/json", **headers}
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(server.url + path, content=content, headers=headers, timeout=120)


def counts(server):
    return server.app.state.embed_fast_path


@pytest.mark.parametrize("path, body", [
    ("/embed", {"inputs": TEXTS}), ("/", {"inputs": TEXTS[0]}),
    ("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"}), ("/v1/embeddings", {"input": TEXTS}),
])
def test_each_route_is_served_by_the_fast_path_from_l1_on_a_repeat_without_a_thread(server, path, body):
    first = post(server, path, body)
    served, thread_calls = counts(server).num_served, server.app.state.workers.num_calls
    again = post(server, path, body)
    assert first.status_code == again.status_code == 200, again.text
    assert counts(server).num_served == served + 1
    assert server.app.state.workers.num_calls == thread_calls  # answered on the event loop, without a thread hop
    num_texts = len(TEXTS) if isinstance(body.get("inputs", body.get("input")), list) else 1
    assert again.headers["x-cache-l1"] == str(num_texts) and again.headers["content-type"] == "application/json"
    assert again.content == first.content  # the L1 hit answers what the computation answered, byte for byte


def test_the_base64_answer_is_what_orjson_writes_for_openais_shape():
    # rows of a multiple of 3 bytes (sliced from one encoding) and not; indices of one, two and three digits
    for dim, num_rows in ((384, 5), (8, 12), (1, 3), (384, 101)):
        vectors = np.random.default_rng(dim).standard_normal((num_rows, dim)).astype("<f4")
        data = [{"object": "embedding", "embedding": base64.b64encode(row.tobytes()).decode(), "index": i}
                for i, row in enumerate(vectors)]
        expected = orjson.dumps({"object": "list", "data": data, "model": 'm "quoted"', "usage": {"prompt_tokens": 7, "total_tokens": 7}})
        assert openai_base64_answer(vectors, 'm "quoted"', 7) == expected
    assert openai_base64_answer(np.empty((0, 384), dtype="<f4"), "m", 0) == orjson.dumps(
        {"object": "list", "data": [], "model": "m", "usage": {"prompt_tokens": 0, "total_tokens": 0}})


def test_the_compiled_answer_assembly_is_built_and_serves():
    assert answers.BASE64_ANSWER.implementation == "compiled"  # built by `make install`: the served path uses it
    assert answers.join_rows is answers.BASE64_ANSWER.compiled.join_rows


def test_both_answer_assemblies_write_the_same_bytes(implementation):
    join_rows = answers.BASE64_ANSWER.of(implementation).join_rows  # tests/conftest.py: compiled, then python
    encoded = bytes(range(48, 48 + 64)) * 24
    for width in (64, 96, 1536):
        for head, tail in ((b"{[", b"]}"), (b"", b"")):
            rows = [encoded[start : start + width] for start in range(0, len(encoded), width)]
            items = [b'{"object":"embedding","embedding":"%b","index":%d}' % (row, i) for i, row in enumerate(rows)]
            assert join_rows(encoded, width, head, tail) == head + b",".join(items) + tail
    assert join_rows(b"", 4, b"[", b"]") == b"[]"
    with pytest.raises(ValueError, match="whole rows"):
        join_rows(b"abc", 2, b"", b"")


def test_a_key_without_the_embed_scope_is_refused_before_the_fast_path_on_every_route(server):
    served = counts(server).num_served
    for path, body in (("/embed", {"inputs": TEXTS}), ("/", {"inputs": TEXTS}), ("/v1/embeddings", {"input": TEXTS})):
        refused = post(server, path, body, key="searcher")
        assert refused.status_code == 403 and "embed" in error_of(refused)["message"], refused.text
        no_key = httpx.post(server.url + path, json=body, timeout=60)
        assert no_key.status_code == 401
    assert counts(server).num_served == served


def test_a_key_over_its_rate_is_refused_before_the_fast_path(server):
    answers = [post(server, "/embed", {"inputs": TEXTS}, key="metered").status_code for _ in range(3)]
    assert answers == [200, 200, 429]


def test_errors_on_the_fast_path_read_as_on_every_route(server):
    too_many = post(server, "/embed", {"inputs": [f"t{i}" for i in range(9)]})
    assert too_many.status_code == 413 and error_of(too_many)["field"] == "inputs"
    unknown = post(server, "/v1/embeddings", {"input": "x", "model": "no-such-model"})
    assert unknown.status_code in (400, 404, 422) and "no-such-model" in error_of(unknown)["message"]
    dims = post(server, "/v1/embeddings", {"input": "x", "dimensions": 3})
    assert dims.status_code == 400 and error_of(dims)["field"] == "dimensions"  # OpenAI's status for an invalid request


def test_a_body_that_does_not_validate_is_handed_to_fastapi_and_gets_its_422(server):
    handed = counts(server).num_handed_over
    for body in ({"inputs": 5}, {"inputs": ["a"], "unknown": 1}, b"{not json", {"input": ["a"], "encoding_format": "hex"}):
        path = "/v1/embeddings" if isinstance(body, dict) and "input" in body else "/embed"
        answer = post(server, path, body)
        # As every route answers; OpenAI's routes answer an invalid request 400, as OpenAI does.
        expected = (400, "invalid_json") if isinstance(body, bytes) else (400 if path == "/v1/embeddings" else 422, "invalid_request")
        assert (answer.status_code, error_of(answer)["type"]) == expected, answer.text
    assert counts(server).num_handed_over == handed + 4
    # Not JSON at all: FastAPI's path, untouched.
    served = counts(server).num_served
    plain = httpx.post(server.url + "/embed", content=b"text", timeout=60,
                       headers={"Authorization": f"Bearer {KEYS['embedder']}", "content-type": "text/plain"})
    assert plain.status_code == 422 and counts(server).num_served == served
