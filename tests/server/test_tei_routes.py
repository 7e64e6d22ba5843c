"""text-embeddings-inference's other routes, driven by the clients people use: huggingface_hub's
``InferenceClient(model=<url>).feature_extraction(...)`` posts to ``POST /``; ``/tokenize`` and ``/decode``
answer in TEI's shapes. A real service over loopback HTTP, the real model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from ragcache.settings import Settings
from tests.errors import error_of
from tests.live_server import LiveServer

KEY = "tei-clients-key-0123456789"


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    settings = Settings(redis_url=redis_server, milvus_uri="off", api_key=KEY, data_dir=tmp_path_factory.mktemp("tei"))
    with LiveServer(settings) as live:
        yield live


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


# huggingface_hub refuses every request, a loopback one too, under HF_HUB_OFFLINE=1 (which the tests need for
# the model): the client runs in its own process without it.
CLIENT = """
import json, sys
import numpy as np
from huggingface_hub import InferenceClient
url, key, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
client = InferenceClient(model=url, token=key)
answers = [client.feature_extraction(texts[0]), client.feature_extraction(texts),
           client.feature_extraction(texts[0], normalize=False)]
print(json.dumps([{"dtype": str(a.dtype), "rows": a.tolist()} for a in answers]))
"""


def feature_extraction(url: str, texts: list[str]) -> list[np.ndarray]:
    env = {name: value for name, value in os.environ.items() if name not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    run = subprocess.run([sys.executable, "-c", CLIENT, url, KEY, json.dumps(texts)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = json.loads(run.stdout)
    assert {answer["dtype"] for answer in answers} == {"float32"}
    return [np.asarray(answer["rows"], dtype=np.float32) for answer in answers]


def test_huggingface_hub_feature_extraction_gets_the_cached_vectors(server, http, encoder):
    texts = ["huggingface_hub posts to the root route", "a second text for the same batch"]
    single, batch, raw = feature_extraction(server.url, texts)
    expected = encoder.encode(texts).numpy()
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)  # TEI normalises by default
    assert single.shape == (1, 384) and batch.shape == (2, 384)
    np.testing.assert_allclose(batch, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(single[0], batch[0])  # the second call found the first text cached
    np.testing.assert_allclose(raw[0], encoder.encode(texts[:1]).numpy()[0], rtol=1e-4, atol=1e-6)
    # The root route is /embed: same answer, same cache headers.
    answer = http.post("/", json={"inputs": texts})
    assert answer.status_code == 200 and answer.headers["X-Cache-Compute"] == "0"


def test_the_root_route_needs_a_key(server):
    assert httpx.post(server.url + "/", json={"inputs": "x"}).status_code == 401


def test_tokenize_answers_in_tei_shape(http):
    answer = http.post("/tokenize", json={"inputs": ["Hello world", "KV caches"]})
    assert answer.status_code == 200, answer.text
    first, second = answer.json()
    assert first == [
        {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None},
        {"id": 7592, "text": "Hello", "special": False, "start": 0, "stop": 5},
        {"id": 2088, "text": "world", "special": False, "start": 6, "stop": 11},
        {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None},
    ]
    assert [token["text"] for token in second] == ["[CLS]", "KV", "cache", "s", "[SEP]"]  # the input's own characters
    plain = http.post("/tokenize", json={"inputs": "Hello world", "add_special_tokens": False}).json()
    assert [token["id"] for token in plain[0]] == [7592, 2088]


def test_decode_gives_the_text_back(http):
    assert http.post("/decode", json={"ids": [101, 7592, 2088, 102]}).json() == ["hello world"]
    assert http.post("/decode", json={"ids": [[101, 7592, 102], [2088]], "skip_special_tokens": False}).json() == [
        "[CLS] hello [SEP]", "world"]


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/decode", {"ids": [7592, -1]}, "ids[1]"),  # refused by the schema (ids are >= 0): item 1 of the one list
    ("/decode", {"ids": [10**9]}, "ids[0][0]"),
    ("/decode", {"ids": "7592"}, "ids"),
    ("/tokenize", {"inputs": []}, "inputs"),
    ("/tokenize", {"inputs": "x", "prompt_name": "query"}, "prompt_name"),
    # A lone surrogate: valid JSON (an escape), not valid Unicode; sent as raw bytes, as httpx will not encode it.
    ("/tokenize", b'{"inputs": ["fine", "a lone surrogate \\ud800"]}', "inputs[1]"),
    ("/embed", b'{"inputs": ["fine", "a lone surrogate \\ud800"], "truncate": false}', "inputs[1]"),  # counted first
])
def test_bad_input_names_the_field(http, path, body, field):
    if isinstance(body, bytes):
        answer = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        answer = http.post(path, json=body)
    assert answer.status_code == 422, answer.text
    assert error_of(answer)["field"] == field
