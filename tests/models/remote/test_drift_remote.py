"""The upstream changes the model behind the same name (fault injection: an OpenAI-shaped loopback server of
our own whose model is swapped mid-run). Over real HTTP, with real Redis and Milvus Lite: no vector of the old
model is served after the check, the drift is counted in /stats and /metrics and shown in /health, and a
restart agrees on the new generation."""

from __future__ import annotations

import base64
import json
import time

import httpx
import numpy as np
import pytest

from ragcache.settings import Settings
from tests.fakes import SwappableEncoder
from tests.live_server import LiveServer
from tests.models.remote.loopback import LoopbackServer, Received, Reply

NAME = "swapped-upstream"
DIM = 16
TEXTS = ["what changed upstream?", "the same name", "another checkpoint behind it"]


class SwappableUpstream:
    """Answers OpenAI's /embeddings with model ``version``'s vectors: clearly distinct per version
    (``SwappableEncoder.vectors``), the same for the same text and version. ``down``: answers 500."""

    def __init__(self):
        self.model = SwappableEncoder(dim=DIM, model=NAME)
        self.down = False
        # A gateway that routes some keys to another deployment: Authorization header -> the version it serves.
        self.version_by_key: dict[str, int] = {}
        self.received_keys: list[str | None] = []

    @property
    def version(self) -> int:
        return self.model.version

    @version.setter
    def version(self, value: int) -> None:
        self.model.version = value

    def vectors(self, texts, version=None) -> np.ndarray:
        return self.model.vectors(texts, version).numpy()

    def answer(self, request: Received) -> Reply:
        if self.down:
            return Reply(500, {"error": {"message": "upstream down"}})
        texts = request.body["input"]
        texts = [texts] if isinstance(texts, str) else texts
        key = request.headers.get("authorization")
        self.received_keys.append(key)
        rows = self.vectors(texts, self.version_by_key.get(key or "")).astype("<f4")
        if request.body.get("encoding_format") == "base64":
            embeddings: list = [base64.b64encode(row.tobytes()).decode() for row in rows]
        else:
            embeddings = [row.tolist() for row in rows]
        data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(embeddings)]
        usage = {"prompt_tokens": 4 * len(texts), "total_tokens": 4 * len(texts)}
        return Reply(200, {"object": "list", "data": data, "model": request.body.get("model"), "usage": usage})


@pytest.fixture
def upstream():
    fake = SwappableUpstream()
    with LoopbackServer(fake.answer) as server:
        fake.url = server.url
        yield fake


def settings_for(upstream, redis_url, data_dir, **overrides) -> Settings:
    model = {"name": NAME, "provider": "openai", "base_url": upstream.url, "upstream_model": "swappable", "dimensions": DIM,
             "max_retries": 0, "timeout_s": 5.0}
    options = dict(models_json=json.dumps({"models": [model]}), model=NAME, redis_url=redis_url, data_dir=data_dir,
                   write_behind=False, drift_check_interval_s=0)
    return Settings(**{**options, **overrides})


def embed(server, texts=TEXTS) -> tuple[np.ndarray, dict[str, int]]:
    response = httpx.post(server.url + "/embed", json={"inputs": texts, "model": NAME, "normalize": False}, timeout=30)
    assert response.status_code == 200, response.text
    levels = {level: int(response.headers.get(f"x-cache-{level.lower()}", 0)) for level in ("L1", "L2", "L3", "Compute")}
    return np.array(response.json(), dtype=np.float32), levels


def test_a_model_swapped_upstream_is_never_served_from_the_cache_again(upstream, redis_url, tmp_path):
    settings = settings_for(upstream, redis_url, tmp_path / "data")
    with LiveServer(settings) as server:
        vectors, levels = embed(server)
        np.testing.assert_array_equal(vectors, upstream.vectors(TEXTS, 0))
        assert levels["Compute"] == len(TEXTS)
        assert embed(server)[1]["L1"] == len(TEXTS)

        upstream.version = 1  # the provider changes the model behind the same name
        assert server.state.drift.check_all() == 1  # what the periodic check does, run now

        vectors, levels = embed(server)
        assert levels["Compute"] == len(TEXTS)  # nothing of the old model from L1, L2 or L3
        np.testing.assert_array_equal(vectors, upstream.vectors(TEXTS, 1))
        health = httpx.get(server.url + "/health").json()
        assert health["status"] == "ok"
        assert health["drift"][NAME] | {"last_drift_at": None} == {
            "status": "changed", "generation": 1, "num_drift_events": 1, "last_drift_at": None}
        stats = httpx.get(server.url + "/stats").json()["models"][NAME]
        assert stats["drift"]["num_drift_events"] == 1 and stats["space"]["generation"] == 1
        metrics = httpx.get(server.url + "/metrics").text
        assert f'ragcache_drift_events_total{{model="{NAME}"}} 1.0' in metrics
        assert f'ragcache_space_generation{{model="{NAME}"}} 1.0' in metrics

    # A restart with the new model upstream: the same generation (no new event), its vectors from L2.
    with LiveServer(settings) as server:
        assert httpx.get(server.url + "/health").json()["drift"][NAME]["generation"] == 1
        assert server.state.drift.states()[0].num_drift_events == 0
        vectors, levels = embed(server)
        assert levels["L2"] == len(TEXTS)
        np.testing.assert_array_equal(vectors, upstream.vectors(TEXTS, 1))


def test_the_periodic_check_notices_a_swap_by_itself(upstream, redis_url, tmp_path):
    with LiveServer(settings_for(upstream, redis_url, tmp_path / "data", drift_check_interval_s=0.2)) as server:
        embed(server)
        upstream.version = 1
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health").json()["drift"][NAME]["status"] != "changed":
            assert time.monotonic() < deadline, "the periodic drift check never ran"
            time.sleep(0.1)
        vectors, levels = embed(server)
        assert levels["Compute"] == len(TEXTS)
        np.testing.assert_array_equal(vectors, upstream.vectors(TEXTS, 1))


def test_an_upstream_down_at_start_keeps_the_service_up_and_the_generation(upstream, redis_url, tmp_path):
    settings = settings_for(upstream, redis_url, tmp_path / "data")
    with LiveServer(settings) as server:
        embed(server)
    upstream.down = True
    with LiveServer(settings) as server:  # starts although its drift check cannot reach the upstream
        assert httpx.get(server.url + "/health").json()["drift"][NAME]["status"] == "check_failing"
        drift = httpx.get(server.url + "/stats").json()["models"][NAME]["drift"]
        assert drift["num_check_errors"] == 1 and drift["last_error"] and drift["generation"] == 0
        upstream.down = False
        deadline = time.monotonic() + 30  # the upstream's breaker lets a call through after its back-off
        while httpx.get(server.url + "/health").json()["drift"][NAME]["status"] != "stable":
            assert time.monotonic() < deadline, "the drift check never recovered"
            assert server.state.drift.check_all() == 0
            time.sleep(0.2)
        vectors, levels = embed(server)
        assert levels["L2"] == len(TEXTS)
        np.testing.assert_array_equal(vectors, upstream.vectors(TEXTS, 0))


def test_a_canary_racing_a_pass_through_request_goes_alone_with_the_models_own_key(upstream):
    from ragcache.core.keys import Generation
    from ragcache.models.drift import CANARY_TEXTS, DriftGuard
    from ragcache.models.fingerprints import Fingerprints, MemoryFingerprints
    from ragcache.models.remote import ApiKey, RemoteModel, open_remote_encoder

    model = RemoteModel(name=NAME, provider="openai", base_url=upstream.url, upstream_model="swappable", dimensions=DIM,
                        max_retries=0, timeout_s=5.0, pass_through_auth=True, api_key_env="DRIFT_TEST_KEY")
    encoder = open_remote_encoder(model, {"DRIFT_TEST_KEY": "model-own-key"})
    guard = DriftGuard(NAME, encoder, Fingerprints([MemoryFingerprints()]), Generation())
    try:
        assert guard.check() is False  # the first fingerprint
        # A caller whose key a gateway routes to another deployment misses the (public) canary texts at the
        # very moment of the check: the canaries must still go with the model's own key, alone.
        upstream.version_by_key["Bearer caller-key"] = 1
        upstream.received_keys.clear()
        with encoder.caller_key(list(CANARY_TEXTS), ApiKey("caller-key")):
            assert guard.check() is False
        assert guard.generation.value == 0 and guard.state().num_drift_events == 0
        assert upstream.received_keys == ["Bearer model-own-key"]
    finally:
        encoder.close()
