"""The model failing fails only the request that holds the failing text, with a clear error.

Requests that miss every level at the same moment are computed in one model batch; a text the model cannot
take (or a batch that runs out of memory) must not fail the others in that batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ragcache.core.cache import ComputeConfig, EmbeddingCache
from ragcache.errors import ComputeError, ModelOutOfMemoryError
from ragcache.models.local import ModelEncoder
from ragcache.storage.processes import poll_until
from ragcache.tiers.memory import MemoryTier
from ragcache_server.errors import install_error_handlers

OOM_TEXT = "this text makes the device run out of memory"
BROKEN_TEXT = "this text breaks the tokenizer"
GATE_TEXT = "this text holds the model until the gate opens"


class FailingEncoder:
    """The real model, failing like a real one would on two marked texts (passed in through the cache's
    constructor: this tests the cache's handling of a failure, not the model)."""

    def __init__(self, encoder: ModelEncoder):
        self.inner = encoder
        self.space = encoder.space
        self.batches: list[list[str]] = []
        self._lock = threading.Lock()
        self.gate = threading.Event()  # a batch holding GATE_TEXT waits for it: the model is busy meanwhile

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        with self._lock:
            self.batches.append(list(texts))
        if GATE_TEXT in texts:
            self.gate.wait(timeout=60)
        if OOM_TEXT in texts:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if BROKEN_TEXT in texts:
            raise ValueError("Input is not valid. Should be a string, a list/tuple of strings or a list/tuple of integers.")
        return self.inner.encode(texts)

    def stats(self):
        return self.inner.stats()


def concurrent_requests(cache: EmbeddingCache, requests: list[list[str]]) -> list[object]:
    """Send the requests at the same moment from threads; each result is the vectors or the exception."""
    barrier = threading.Barrier(len(requests))
    results: list[object] = [None] * len(requests)

    def send(index: int) -> None:
        barrier.wait()
        try:
            results[index] = cache.embed(requests[index], as_tensor=True)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[index] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def requests_in_one_batch(cache: EmbeddingCache, failing: FailingEncoder, requests: list[list[str]]) -> list[object]:
    """Send the requests while the model is busy on a held batch, so that all their texts are queued when it is
    free again and go to the model in one batch (no timing window to rely on)."""
    holder = threading.Thread(target=cache.embed, args=([GATE_TEXT],))
    holder.start()
    assert poll_until(lambda: [GATE_TEXT] in failing.batches, timeout_s=30, interval_s=0.005)
    num_texts = len({text for texts in requests for text in texts})
    results: list[object] = []
    sender = threading.Thread(target=lambda: results.extend(concurrent_requests(cache, requests)))
    sender.start()
    assert poll_until(lambda: cache.resolver.batcher.num_pending == num_texts, timeout_s=30, interval_s=0.005)
    failing.gate.set()
    sender.join(timeout=120)
    holder.join(timeout=120)
    return results


def cache_over(encoder) -> EmbeddingCache:
    # A long batching window, so the concurrent requests land in one model batch together.
    l1 = MemoryTier(1 << 20, encoder.space.dim, torch.float32)
    return EmbeddingCache(encoder, [l1], compute=ComputeConfig(max_batch=64, max_wait_s=0.3))


@pytest.mark.parametrize(("poison", "error_type", "words"), [(OOM_TEXT, ModelOutOfMemoryError, "out of memory"),
                                                          (BROKEN_TEXT, ComputeError, "ValueError")])
def test_a_failing_text_fails_only_its_own_request(encoder, poison, error_type, words):
    failing = FailingEncoder(encoder)
    requests = [[f"request {i}, an ordinary text", "shared by all"] for i in range(6)] + [["an ordinary text too", poison]]
    with cache_over(failing) as cache:
        results = requests_in_one_batch(cache, failing, requests)
        assert any(poison in batch and len(batch) > 2 for batch in failing.batches)  # it shared a batch with others
        *fine, failed = results
        assert isinstance(failed, error_type) and words in str(failed)
        for texts, vectors in zip(requests, fine):
            assert torch.allclose(vectors, encoder.encode(texts), atol=1e-5)
        # The failure is not remembered as a result: the same text fails again; its neighbour alone is fine.
        with pytest.raises(error_type):
            cache.embed([poison])
        assert torch.allclose(cache.embed(["an ordinary text too"], as_tensor=True), encoder.encode(["an ordinary text too"]), atol=1e-5)


def test_a_real_model_failure_fails_only_its_request():
    """A real failure of the real model: with max_seq_length set above the model's 512 positions, a text
    longer than 512 tokens breaks the forward pass (tensor size mismatch); short texts beside it are fine."""
    encoder = ModelEncoder(max_seq_length=1024)
    too_long = "word " * 700
    requests = [[f"short text {i}"] for i in range(4)] + [[too_long]]
    with cache_over(encoder) as cache:
        *fine, failed = concurrent_requests(cache, requests)
        assert isinstance(failed, ComputeError) and "RuntimeError" in str(failed)
        assert isinstance(failed.__cause__, RuntimeError)
        for vectors in fine:
            assert vectors.shape == (1, 384) and torch.isfinite(vectors).all()


def test_model_errors_answer_clear_json():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/oom")
    def oom():
        raise ModelOutOfMemoryError("the model ran out of memory on this text; retry, or send fewer or shorter texts")

    @app.get("/broken")
    def broken():
        raise ComputeError("the model failed on this text: ValueError: bad input")

    with TestClient(app) as client:
        oom_response, broken_response = client.get("/oom"), client.get("/broken")
    assert oom_response.status_code == 503 and oom_response.json()["error"]["type"] == "model_out_of_memory"
    assert "retry" in oom_response.json()["error"]["message"]
    assert broken_response.status_code == 500 and broken_response.json()["error"]["type"] == "model_failed"
    assert "ValueError: bad input" in broken_response.json()["error"]["message"]
