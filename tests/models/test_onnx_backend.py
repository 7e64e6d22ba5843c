"""The ONNX Runtime backend (ragcache.models.onnx) with the real packaged model, exported here: its vectors
against torch's, its own spaces, the export kept and reused, and serving through the cache and the service.
The encoders are tests/models/conftest.py's; what every encoder must do is tests/models/test_encoder_contract.py."""

from __future__ import annotations

import dataclasses

import httpx
import numpy as np
import pytest
import redis
import torch

from ragcache.build import build_cache
from ragcache.errors import ConfigError
from ragcache.models.local import PACKAGED_MODEL
from ragcache.models.onnx import OnnxEncoder
from ragcache.settings import Settings
from ragcache.storage.stores import Stores
from tests.live_server import LiveServer

# Varied real-looking texts: short, long (truncated at 256 tokens), non-ASCII, a prompt-like prefix, empty.
TEXTS = [
    "",
    "hello",
    "Redis keeps the second level of the cache; Milvus Lite the third.",
    "Grüße aus 東京 🙂 — naïve café, résumé",
    "query: how do I make the miss path faster than the systems it replaces?",
    " ".join(f"word{i}" for i in range(600)),
    *[f"passage {i}: the quick brown fox jumps over the lazy dog " * (i % 5 + 1) for i in range(40)],
]
# Largest cosine distance from torch's vectors (measured on TEXTS: float32 1.2e-7, int8 0.023).
FLOAT32_BOUND = 1e-5
INT8_BOUND = 0.05


def cosine_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 1 - torch.nn.functional.cosine_similarity(a, b)


def test_onnx_vectors_match_torch(encoder, onnx_encoder):
    distances = cosine_distances(encoder.encode(TEXTS), onnx_encoder.encode(TEXTS))
    assert distances.max().item() < FLOAT32_BOUND, f"largest cosine distance {distances.max().item():.3g}"


def test_int8_vectors_are_close_to_torch(encoder, int8_encoder):
    distances = cosine_distances(encoder.encode(TEXTS), int8_encoder.encode(TEXTS))
    assert distances.max().item() < INT8_BOUND, f"largest cosine distance {distances.max().item():.3g}"


def test_normalize_and_prompt_are_applied_like_torch(encoder, onnx_data_dir):
    from ragcache.models.local import ModelEncoder

    torch_encoder = ModelEncoder(normalize=True, prompt="query: ")
    onnx = OnnxEncoder(backend="onnx", cache_dir=onnx_data_dir / "onnx", normalize=True, prompt="query: ")
    expected, actual = torch_encoder.encode(TEXTS[:6]), onnx.encode(TEXTS[:6])
    assert cosine_distances(expected, actual).max().item() < FLOAT32_BOUND
    np.testing.assert_allclose(actual.norm(dim=1).numpy(), 1.0, rtol=1e-5)
    assert onnx.space.prompt == "query: " and onnx.space.normalize


def test_each_backend_is_its_own_space_and_torch_keeps_its_id(encoder, onnx_encoder, int8_encoder):
    ids = {encoder.space.space_id, onnx_encoder.space.space_id, int8_encoder.space.space_id}
    assert len(ids) == 3
    assert "backend" not in encoder.space.canonical()
    assert onnx_encoder.space.backend == "onnx" and int8_encoder.space.backend == "onnx-int8"
    # Everything else about the space is the torch model's: same model, revision, dim, length.
    assert dataclasses.replace(onnx_encoder.space, backend=None) == encoder.space


def test_the_export_is_kept_and_reused(onnx_data_dir, onnx_encoder, int8_encoder):
    files = sorted(p.name for p in onnx_encoder.onnx_path.parent.iterdir())
    assert files == ["model.int8.onnx", "model.onnx"]  # no temporary file left behind
    modified = onnx_encoder.onnx_path.stat().st_mtime_ns
    again = OnnxEncoder(backend="onnx", cache_dir=onnx_data_dir / "onnx")
    assert again.onnx_path == onnx_encoder.onnx_path and again.onnx_path.stat().st_mtime_ns == modified


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "tensorrt"}, "backend"),
    ({"dtype": "float16"}, "float32"),
])
def test_bad_settings_are_refused_by_name(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        OnnxEncoder(cache_dir=tmp_path, **kwargs)


def test_served_through_the_cache_with_real_redis(redis_url, onnx_data_dir, int8_encoder):
    settings = Settings(redis_url=redis_url, milvus_uri="off", data_dir=onnx_data_dir, model_backend="onnx-int8")
    stores = Stores.open(settings)
    from ragcache.build import load_encoder

    encoder = load_encoder(settings)
    assert encoder.space == int8_encoder.space
    with build_cache(settings, stores, encoder, on_close=stores.close) as cache:
        texts = ["cached on int8 one", "cached on int8 two"]
        first = cache.embed(texts)
        again = cache.embed(texts)
        np.testing.assert_array_equal(first, again)
        cache.flush()
        keys = encoder.space.keys(texts)
        assert all(f":{int8_encoder.space.space_id}:" in key for key in keys)
    assert redis.Redis.from_url(redis_url).exists(*keys) == 2


def test_served_by_the_service_per_model(redis_url, onnx_data_dir, encoder, onnx_encoder):
    settings = Settings(redis_url=redis_url, milvus_uri="off", data_dir=onnx_data_dir,
                        model_backends={PACKAGED_MODEL: "onnx"})
    with LiveServer(settings) as live:
        texts = ["served by onnx runtime", "through the service"]
        first = httpx.post(live.url + "/embed", json={"inputs": texts, "normalize": False}, timeout=60)
        assert first.status_code == 200 and first.headers["x-cache-compute"] == "2"
        again = httpx.post(live.url + "/embed", json={"inputs": texts, "normalize": False}, timeout=60)
        assert again.headers["x-cache-l1"] == "2"
        served = torch.tensor(first.json())
        assert cosine_distances(served, encoder.encode(texts)).max().item() < FLOAT32_BOUND
        info = httpx.get(live.url + "/info").json()
        assert info["models"][0]["space"] == onnx_encoder.space.describe()
        assert info["models"][0]["space"]["backend"] == "onnx"


def test_a_backend_for_a_model_not_served_is_refused(tmp_path):
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=tmp_path, model_backends={"nope": "onnx"})
    from ragcache_server.state import ServiceState

    with pytest.raises(ConfigError, match="model_backends"):
        ServiceState.open(settings)
