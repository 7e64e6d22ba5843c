"""The TEI and Ollama encoders against their native wire formats, with a real model behind them.

Infinity speaks neither TEI's ``POST /embed`` nor Ollama's ``POST /api/embed``, so a small translator of our
own (``loopback.py``) stands in front of it: it takes the native request, checks its shape, asks Infinity
(the real all-MiniLM-L6-v2) for the same texts in the same batch, and answers in the native shape. It is
there for the wire format only; the vectors are Infinity's, so they must come back bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from ragcache.errors import UpstreamBadResponseError
from ragcache.models.remote import OllamaEncoder, RemoteModel, TEIEncoder, open_remote_encoder
from tests.models.remote.loopback import LoopbackServer, Received, Reply
from tests.models.remote.test_providers_infinity import infinity_vectors

TEXTS = ["What is a KV cache?", "", "Die Katze schläft.", "east " * 200]
TEI_PROMPTS = {"query": "query: "}  # the prompts the pretend TEI server has configured by name
SECRET = "ollama-proxy-key-0123456789"


def tei_translator(infinity):
    def answer(request: Received) -> Reply:
        body = request.body
        assert request.path == "/embed" and set(body) <= {"inputs", "normalize", "truncate", "prompt_name"}
        assert isinstance(body["normalize"], bool) and isinstance(body["truncate"], bool)
        texts = [TEI_PROMPTS.get(body.get("prompt_name"), "") + text for text in body["inputs"]]
        return Reply(200, infinity_vectors(infinity, texts).tolist())

    return answer


def ollama_translator(infinity):
    def answer(request: Received) -> Reply:
        body = request.body
        assert request.path == "/api/embed" and body["model"] == "all-minilm" and isinstance(body["input"], list)
        vectors = infinity_vectors(infinity, body["input"])
        return Reply(200, {"model": "all-minilm", "embeddings": vectors.tolist(), "prompt_eval_count": 7 * len(vectors)})

    return answer


@pytest.fixture(scope="module")
def tei(infinity):
    with LoopbackServer(tei_translator(infinity)) as server:
        yield server


@pytest.fixture(scope="module")
def ollama(infinity):
    with LoopbackServer(ollama_translator(infinity)) as server:
        yield server


def test_the_tei_encoder_speaks_teis_native_route(tei, infinity):
    model = RemoteModel(name="tei-minilm", provider="tei", base_url=tei.url, upstream_model="minilm", dimensions=384,
                        normalize=True, prompt_name="query", max_inputs=8)
    encoder = TEIEncoder(model)
    try:
        vectors = encoder.encode(TEXTS).numpy()
    finally:
        encoder.close()
    (request,) = tei.received
    assert request.body == {"inputs": TEXTS, "normalize": True, "truncate": True, "prompt_name": "query"}
    assert "authorization" not in request.headers  # no key configured, none sent
    expected = infinity_vectors(infinity, ["query: " + text for text in TEXTS])
    assert np.array_equal(vectors.view(np.uint32), expected.view(np.uint32))


def test_the_ollama_encoder_speaks_ollamas_native_route(ollama, infinity):
    model = RemoteModel(name="ollama-minilm", provider="ollama", base_url=ollama.url, upstream_model="all-minilm",
                        dimensions=384, normalize=True, api_key_env="OLLAMA_PROXY_KEY", max_inputs=8)
    encoder = open_remote_encoder(model, {"OLLAMA_PROXY_KEY": SECRET})
    assert isinstance(encoder, OllamaEncoder)
    try:
        vectors = encoder.encode(TEXTS).numpy()
        stats = encoder.stats()
    finally:
        encoder.close()
    (request,) = ollama.received
    assert request.body == {"model": "all-minilm", "input": TEXTS, "truncate": True}
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert np.array_equal(vectors.view(np.uint32), infinity_vectors(infinity, TEXTS).view(np.uint32))
    assert stats.num_tokens == 7 * len(TEXTS)  # the upstream's own count (prompt_eval_count) is what was billed


def test_the_tei_encoder_refuses_an_answer_of_the_wrong_shape():
    with LoopbackServer(lambda request: Reply(200, {"embeddings": [[0.0] * 384]})) as server:
        encoder = TEIEncoder(RemoteModel(name="tei-bad", provider="tei", base_url=server.url, upstream_model="m", dimensions=384))
        try:
            with pytest.raises(UpstreamBadResponseError, match="not usable"):
                encoder.encode(["a"])
        finally:
            encoder.close()
