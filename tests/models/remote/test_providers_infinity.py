"""ragcache in front of a real, independent OpenAI-compatible server: Infinity serving all-MiniLM-L6-v2.

Every vector ragcache serves for a remote model, from whichever level, must be the upstream's own vector
for that text, bit for bit: Infinity sends float32 values (base64: the raw bytes; JSON: numbers printed
from float32, which parse back exactly), and ragcache stores and returns float32.

Measured here: Infinity's float and base64 answers to one request agree bit for bit, and one request sent
twice gets the same bits; but a text's vector depends on the batch it was computed in (padding changes
the matrix shapes): the same text in another batch differs by up to ~2e-7. So the comparisons send
Infinity the same batches ragcache sent.
"""

from __future__ import annotations

import base64
import dataclasses
import json

import httpx
import numpy as np
import pytest

from ragcache.models.remote import OpenAIEncoder, RemoteModel, remote_space
from ragcache.settings import Settings
from tests.live_server import LiveServer

TEXTS = ["What is a KV cache?", "Redis is an in-memory store.", "", "naïve café 🤖", "x" * 3000]


def infinity_vectors(infinity, texts: list[str], encoding_format: str = "float") -> np.ndarray:
    """What Infinity itself answers for ``texts``, asked directly."""
    answer = httpx.post(f"{infinity.base_url}/embeddings", timeout=60,
                        json={"model": infinity.model_id, "input": texts, "encoding_format": encoding_format}).json()
    rows = [item["embedding"] for item in answer["data"]]
    if encoding_format == "base64":
        return np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in rows])
    return np.array(rows, dtype=np.float32)


def infinity_model(infinity, **overrides) -> RemoteModel:
    options = dict(name="minilm-remote", provider="openai", base_url=infinity.base_url, upstream_model=infinity.model_id,
                   dimensions=384, normalize=True, max_inputs=8, tokenizer=str(infinity.config.model))
    return RemoteModel(**{**options, **overrides})


def test_the_float_and_base64_answers_of_infinity_agree_bit_for_bit(infinity):
    # The premise of bit-exact comparisons: both transfer formats carry the same float32 values.
    floats, raw = infinity_vectors(infinity, TEXTS), infinity_vectors(infinity, TEXTS, "base64")
    assert floats.dtype == raw.dtype == np.float32
    assert np.array_equal(floats.view(np.uint32), raw.view(np.uint32))


def test_the_openai_encoder_returns_infinitys_own_vectors(infinity):
    # 5 texts, 2 per request: 3 upstream requests. One at a time, so that Infinity computes each as its own
    # batch (requests in flight together it batches together, which changes the last bits).
    encoder = OpenAIEncoder(infinity_model(infinity, max_inputs=2, concurrency=1))
    try:
        vectors = encoder.encode(TEXTS).numpy()
        stats = encoder.stats()
    finally:
        encoder.close()
    batches = [TEXTS[0:2], TEXTS[2:4], TEXTS[4:5]]
    expected = np.concatenate([infinity_vectors(infinity, batch) for batch in batches])
    assert np.array_equal(vectors.view(np.uint32), expected.view(np.uint32))
    assert (stats.num_calls, stats.num_batches, stats.num_texts, stats.num_errors) == (3, 3, 5, 0)
    assert stats.num_tokens > 0 and stats.token_counting == "tokenizer"


def test_requests_in_parallel_get_the_same_vectors_up_to_batching_noise(infinity):
    encoder = OpenAIEncoder(infinity_model(infinity, max_inputs=1, concurrency=5))
    try:
        vectors = encoder.encode(TEXTS).numpy()
        assert encoder.stats().num_calls == 5
    finally:
        encoder.close()
    np.testing.assert_allclose(vectors, infinity_vectors(infinity, TEXTS), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def service(infinity, redis_server, tmp_path_factory):
    model = infinity_model(infinity)
    models = {"models": [dataclasses.asdict(model)]}

    # The remote model is the default: no local model is loaded.
    settings = Settings(model="minilm-remote", models_json=json.dumps(models), redis_url=redis_server,
                        model_prompts={"minilm-remote": {"query": "query: "}},
                        data_dir=tmp_path_factory.mktemp("data"), write_behind=False, single_flight=False,
                        # The drift check only at start: its canaries, sent while a test's request is in flight,
                        # would be batched with it by Infinity and change the last bits the test compares.
                        drift_check_interval_s=0)
    with LiveServer(settings) as server:
        yield server


def embed(service, texts, model="minilm-remote", **extra):
    response = httpx.post(f"{service.url}/v1/embeddings", json={"model": model, "input": texts, **extra}, timeout=60)
    assert response.status_code == 200, response.text
    rows = [item["embedding"] for item in response.json()["data"]]
    if extra.get("encoding_format") == "base64":
        return np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in rows]), response
    return np.array(rows, dtype=np.float32), response


def test_vectors_from_every_level_equal_infinitys_own(service, infinity):
    texts = [f"level check {i}: {t}" for i, t in enumerate(TEXTS)]
    expected = infinity_vectors(infinity, texts).view(np.uint32)
    cache = service.state.cache_for("minilm-remote")
    assert cache.space.model == infinity.model_id and cache.space.provider == "openai"
    assert cache.space.space_id == remote_space(infinity_model(infinity)).space_id  # generation 0: never drifted
    sent_before = cache.encoder.stats().num_texts  # the drift check's canaries went first

    computed, response = embed(service, texts)
    assert response.headers["X-Cache-Compute"] == str(len(texts))
    assert np.array_equal(computed.view(np.uint32), expected)

    from_l1, response = embed(service, texts)
    assert response.headers["X-Cache-L1"] == str(len(texts))
    assert np.array_equal(from_l1.view(np.uint32), expected)

    for level in ("L1", "L2"):
        # Empty the levels above the one under test: the next answer must come from it.
        forget_above(cache, level)
        served, response = embed(service, texts, encoding_format="base64")
        below = {"L1": "L2", "L2": "L3"}[level]
        assert response.headers[f"X-Cache-{below}"] == str(len(texts)), dict(response.headers)
        assert np.array_equal(served.view(np.uint32), expected)
    assert cache.encoder.stats().num_texts - sent_before == len(texts)  # the upstream was asked once per text


def forget_above(cache, level: str) -> None:
    """Drop every entry of the levels down to ``level`` (L1: the slab; L2: its keys in Redis)."""
    cache.tiers[0].clear()
    if level == "L2":
        tier = cache.tiers[1]
        keys = list(tier.client.scan_iter(f"rc:{cache.space.space_id}:*"))
        if keys:
            tier.client.delete(*keys)


def test_a_named_prompt_of_a_remote_model_is_prepended_to_what_it_sends(service, infinity):
    texts = ["prompted one", "prompted two"]
    vectors, response = embed(service, texts, input_type="query")
    assert response.headers["X-Cache-Compute"] == "2"
    expected = infinity_vectors(infinity, ["query: " + text for text in texts])
    assert np.array_equal(vectors.view(np.uint32), expected.view(np.uint32))
    again, response = embed(service, texts, input_type="query")
    assert response.headers["X-Cache-L1"] == "2" and np.array_equal(again, vectors)
