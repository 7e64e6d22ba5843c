"""The embedding edge keeps the ecosystems' own contracts (issue 39.4, 39.5), checked through their real clients
against a real service (the packaged model, loopback HTTP):

- OpenAI's ``/v1/embeddings`` through the ``openai`` SDK: every invalid request raises the class OpenAI's reference
  names (``BadRequestError``, ``NotFoundError``, ``AuthenticationError``, ``PermissionDeniedError``,
  ``RateLimitError``) with ``param`` and ``code`` set; token-id input is read with the served model's tokenizer, and
  an id beyond its vocabulary is refused naming the item and saying what to do.
- text-embeddings-inference's routes through ``huggingface_hub`` and plain HTTP: TEI's error body
  ``{"error": "<message>", "error_type": ...}``, ``truncation_direction`` in either case and either direction (Left
  changes only an over-long text's vector), token-id input.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import httpx
import numpy as np
import openai
import pytest

from ragcache.settings import Settings
from tests.live_server import LiveServer

KEYS = {"embedder": "contracts-embed-key-0123456789", "searcher": "contracts-search-key-0123456789",
        "metered": "contracts-metered-key-0123456789"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("contracts")
    sha = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    keys = {"keys": [{"name": "embedder", "sha256": sha(KEYS["embedder"]), "scopes": ["embed"]},
                     {"name": "searcher", "sha256": sha(KEYS["searcher"]), "scopes": ["search"]},
                     {"name": "metered", "sha256": sha(KEYS["metered"]), "scopes": ["embed"], "rate_limit_per_s": 0.01,
                      "rate_limit_burst": 1}]}
    (folder / "keys.json").write_text(json.dumps(keys))
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=folder, api_keys_file=folder / "keys.json", max_batch=8)
    with LiveServer(settings) as live:
        yield live


def sdk(server, key: str = "embedder") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEYS.get(key, key), max_retries=0, timeout=120)


def post(server, path: str, body: dict, key: str = "embedder") -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {KEYS[key]}"}, timeout=120)


@pytest.mark.parametrize(("options", "param", "code"), [
    ({"input": []}, "input", "invalid_request"),  # an empty list
    ({"input": ["x"] * 9}, "input", "invalid_request"),  # over max_batch (ragcache's 413)
    ({"input": "x", "dimensions": 3}, "dimensions", "invalid_request"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", "invalid_request"),  # ragcache's 422
    ({"input": "x", "extra_body": {"prompt_name": "no-such-prompt"}}, "prompt_name", "invalid_request"),
])
def test_an_invalid_openai_request_raises_bad_request_with_param_and_code(server, options, param, code):
    with pytest.raises(openai.BadRequestError) as raised:
        sdk(server).embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", **options)
    error = raised.value
    assert error.status_code == 400 and error.param == param and error.code == code, error.body
    assert error.type == "invalid_request_error" and error.body["field"] == param  # ragcache's field kept beside it


def test_an_unknown_model_raises_not_found_with_model_not_found(server):
    with pytest.raises(openai.NotFoundError) as raised:
        sdk(server).embeddings.create(model="no-such-model", input="x")
    assert raised.value.code == "model_not_found" and raised.value.param == "model"
    assert "no-such-model" in raised.value.message


@pytest.mark.parametrize(("key", "kind", "code"), [
    ("wrong-key-0123456789", openai.AuthenticationError, "invalid_api_key"),
    ("searcher", openai.PermissionDeniedError, "forbidden"),
])
def test_keys_are_refused_as_openai_types_them(server, key, kind, code):
    with pytest.raises(kind) as raised:
        sdk(server, key).embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input="x")
    assert raised.value.code == code and raised.value.body["type"] in ("invalid_request_error", "permission_error")


def test_a_key_over_its_rate_raises_rate_limit_error(server):
    client = sdk(server, "metered")
    with pytest.raises(openai.RateLimitError) as raised:
        for _ in range(3):  # a burst of one
            client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input="metered")
    assert raised.value.code == "rate_limit_exceeded" and raised.value.body["type"] == "requests"


def test_token_ids_are_read_with_the_served_models_tokenizer(server):
    texts = ["token ids are read with the tokenizer", "a second text of ids"]
    tokens = post(server, "/tokenize", {"inputs": texts, "add_special_tokens": False}).json()
    ids = [[token["id"] for token in row] for row in tokens]
    client = sdk(server)
    from_text = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts)
    from_ids = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=ids)
    one = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=ids[0])
    for text_row, id_row in zip(from_text.data, from_ids.data):
        assert text_row.embedding == id_row.embedding
    assert one.data[0].embedding == from_text.data[0].embedding and from_ids.usage.prompt_tokens > 0
    tei = post(server, "/embed", {"inputs": ids, "normalize": False})
    assert tei.status_code == 200 and np.allclose(tei.json(), [row.embedding for row in from_text.data])


def test_a_token_id_beyond_the_vocabulary_is_refused_naming_the_item_and_what_to_do(server):
    tiktoken_ids = [[9906, 1917], [9906, 100_255]]  # cl100k ids: the second is beyond a 30,522-token vocabulary
    with pytest.raises(openai.BadRequestError) as raised:
        sdk(server).embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=tiktoken_ids)
    assert raised.value.param == "input[1][1]" and raised.value.code == "tokenizer"
    assert "check_embedding_ctx_length=False" in raised.value.message
    one_row = post(server, "/embed", {"inputs": [101, 100_255]})
    assert one_row.status_code == 422, one_row.text
    assert one_row.json()["error_type"] == "Tokenizer" and one_row.json()["field"] == "inputs[1]"


@pytest.mark.parametrize(("path", "body", "status", "error_type"), [
    ("/embed", {"inputs": []}, 422, "Validation"),
    ("/embed", {"inputs": ["x"] * 9}, 413, "Validation"),
    ("/embed", {"inputs": "x", "truncation_direction": "Sideways"}, 422, "Validation"),
    ("/", {"inputs": 5}, 422, "Validation"),
    ("/embed", {"inputs": "x", "model": "no-such-model"}, 404, "Validation"),
    ("/tokenize", {"inputs": "x", "prompt_name": "query"}, 422, "Validation"),
    ("/decode", {"ids": [101, 10**9]}, 422, "Tokenizer"),
    ("/rerank", {"query": "q", "texts": "not a list"}, 422, "Validation"),
])
def test_tei_routes_answer_errors_in_teis_shape(server, path, body, status, error_type):
    response = post(server, path, body, key="searcher" if path == "/rerank" else "embedder")
    assert response.status_code == status, response.text
    error = response.json()
    assert isinstance(error["error"], str) and error["error"] and error["error_type"] == error_type


def test_tei_shape_for_refused_keys_and_ragcache_shape_elsewhere(server):
    refused = post(server, "/embed", {"inputs": "x"}, key="searcher")
    assert refused.status_code == 403 and refused.json()["error_type"] == "Validation"
    cohere = post(server, "/rerank", {"query": "q", "documents": "not a list"}, key="searcher")
    assert isinstance(cohere.json()["error"], dict)  # the Cohere/Infinity body: ragcache's own shape
    search = httpx.post(server.url + "/search", json={"query": "q", "collection": "c"},
                        headers={"Authorization": f"Bearer {KEYS['searcher']}"}, timeout=60)
    assert set(search.json()["error"]) == {"type", "message", "field"}


def test_truncation_direction_in_any_case_and_left_changes_only_an_over_long_texts_vector(server):
    tail = " ".join(f"tail{i}" for i in range(400))  # far over the model's 256 tokens
    texts = ["a short text", "alpha beginning " + tail, "omega start " + tail]
    answers = {direction: post(server, "/embed", {"inputs": texts, "truncation_direction": direction})
               for direction in ("Right", "right", "RIGHT", "Left", "left")}
    assert {response.status_code for response in answers.values()} == {200}, [r.text for r in answers.values()]
    right, left = np.asarray(answers["Right"].json()), np.asarray(answers["left"].json())
    assert np.array_equal(np.asarray(answers["right"].json()), right) and np.array_equal(np.asarray(answers["Left"].json()), left)
    assert np.array_equal(left[0], right[0])  # a text within the limit: the same vector (and key)
    assert np.array_equal(left[1], left[2])  # Left keeps the end, which the two share
    assert not np.allclose(right[1], right[2]) and not np.allclose(left[1], right[1])  # Right keeps their beginnings


# huggingface_hub refuses every request, a loopback one too, under HF_HUB_OFFLINE=1 (which the tests need for
# the model): the client runs in its own process without it.
CLIENT = """
import json, sys
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
url, key = sys.argv[1], sys.argv[2]
client = InferenceClient(model=url, token=key)
left = client.feature_extraction("a text", truncation_direction="left", truncate=True)
try:
    client.feature_extraction("x", truncation_direction="left", truncate=True, prompt_name="no-such-prompt")
    refused = None
except HfHubHTTPError as exc:
    refused = {"status": exc.response.status_code, "body": exc.response.json()}
print(json.dumps({"shape": list(left.shape), "refused": refused}))
"""


def test_huggingface_hub_sends_left_truncation_and_reads_teis_error(server):
    env = {name: value for name, value in os.environ.items() if name not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    run = subprocess.run([sys.executable, "-c", CLIENT, server.url, KEYS["embedder"]], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout)
    assert answer["shape"] == [1, 384]
    assert answer["refused"]["status"] == 422 and answer["refused"]["body"]["error_type"] == "Validation"
    assert "no-such-prompt" in answer["refused"]["body"]["error"]
