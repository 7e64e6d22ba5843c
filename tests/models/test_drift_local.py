"""The drift check protects the local model when ``model_revision`` is set by hand (no content hash then):
the real packaged model, copied, its weights changed on disk between two starts, real Redis and Milvus Lite."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ragcache.build import build_cache, drift_monitor, load_encoder
from ragcache.models.local import resolve_model_path
from ragcache.settings import Settings
from ragcache.storage.stores import Stores

TEXTS = ["how do I reset my password?", "shipping times to Norway", "refund policy for damaged goods"]
COMPUTED = 3  # L1, L2, L3, compute
# The last layer's output projection, scaled by 1.05: canaries move by ~3e-2, far past the float32 tolerance.
PERTURBED_TENSOR, FACTOR = "encoder.layer.5.output.dense.weight", 1.05


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "minilm"
    shutil.copytree(resolve_model_path("all-MiniLM-L6-v2"), folder)
    return folder


def start(settings: Settings, stores: Stores):
    """What a service start does for one model: load it, build its cache, run the drift check."""
    cache = build_cache(settings, stores, load_encoder(settings))
    monitor = drift_monitor(settings, stores, {settings.space.model: cache}).start()
    return cache, monitor


def test_weights_changed_under_a_fixed_revision_serve_no_old_vector(model_copy, redis_client, milvus_client):
    settings = Settings(model=str(model_copy), model_revision="v1", write_behind=False, drift_check_interval_s=0,
                        redis_url="redis://unused", milvus_uri="unused.db")
    stores = Stores(redis_client, milvus_client)
    cache, monitor = start(settings, stores)
    assert cache.space.revision == "v1" and cache.space.generation == 0
    old = cache.embed(TEXTS)
    space_id = cache.space.space_id
    monitor.close()
    cache.close()

    weights = load_file(model_copy / "model.safetensors")
    weights[PERTURBED_TENSOR] = (weights[PERTURBED_TENSOR] * FACTOR).astype(np.float32)
    save_file(weights, model_copy / "model.safetensors", metadata={"format": "pt"})

    cache, monitor = start(settings, stores)  # a restart: same name, same hand-set revision, other weights
    (state,) = monitor.states()
    assert (state.generation, state.num_drift_events) == (1, 1) and state.last_distance > state.tolerance
    assert cache.space.generation == 1 and cache.space.space_id != space_id
    result = cache.embed_detailed(TEXTS)
    assert (result.levels == COMPUTED).all()  # nothing of generation 0 found in L1, L2 or L3
    np.testing.assert_array_equal(result.vectors, cache.encoder.encode(TEXTS).numpy())
    assert not np.allclose(result.vectors, old, atol=1e-3)

    # One more restart with the changed weights: the same generation, and its vectors served from L2.
    monitor.close()
    cache.close()
    cache, monitor = start(settings, stores)
    assert monitor.states()[0].generation == 1 and monitor.states()[0].num_drift_events == 0
    again = cache.embed_detailed(TEXTS)
    assert (again.levels == 1).all()
    np.testing.assert_array_equal(again.vectors, result.vectors)
    monitor.close()
    cache.close()


def test_the_service_says_so_in_health_stats_and_metrics(tmp_path, redis_url):
    """Over real HTTP: a service restarted on changed weights (same revision label) reports the drift and
    computes every text again rather than serving what the old weights left in Redis and Milvus."""
    import httpx

    from tests.live_server import LiveServer

    folder = tmp_path / "minilm"
    shutil.copytree(resolve_model_path("all-MiniLM-L6-v2"), folder)
    settings = Settings(model=str(folder), model_revision="v1", redis_url=redis_url, data_dir=tmp_path / "data",
                        drift_check_interval_s=0, write_behind=False)
    with LiveServer(settings) as server:
        health = httpx.get(server.url + "/health").json()
        assert health["drift"][str(folder)]["status"] == "stable"
        first = httpx.post(server.url + "/embed", json={"inputs": TEXTS}, timeout=60)
        assert first.headers["X-Cache-Compute"] == str(len(TEXTS))

    weights = load_file(folder / "model.safetensors")
    weights[PERTURBED_TENSOR] = (weights[PERTURBED_TENSOR] * FACTOR).astype(np.float32)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    with LiveServer(settings) as server:
        health = httpx.get(server.url + "/health").json()
        assert health["status"] == "ok"
        drift = health["drift"][str(folder)]
        assert (drift["status"], drift["generation"], drift["num_drift_events"]) == ("changed", 1, 1)
        again = httpx.post(server.url + "/embed", json={"inputs": TEXTS}, timeout=60)
        assert again.headers["X-Cache-Compute"] == str(len(TEXTS))  # nothing of the old weights served
        assert not np.allclose(np.array(again.json()), np.array(first.json()), atol=1e-3)
        stats = httpx.get(server.url + "/stats").json()["models"][str(folder)]
        assert stats["drift"]["num_drift_events"] == 1 and stats["space"]["generation"] == 1
        metrics = httpx.get(server.url + "/metrics").text
        assert f'ragcache_drift_events_total{{model="{folder}"}} 1.0' in metrics
        assert f'ragcache_space_generation{{model="{folder}"}} 1.0' in metrics
