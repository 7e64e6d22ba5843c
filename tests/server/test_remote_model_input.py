"""A remote model's texts are checked like a local model's before anything is sent: a lone surrogate is a 422
naming the text, whether the length check counts with the model's own tokenizer or by estimate. A real service
over loopback HTTP, the instant OpenAI-compatible upstream as the remote model."""

from __future__ import annotations

import json

import httpx
import pytest

from ragcache.models.local import PACKAGED_MODEL
from ragcache.settings import Settings
from ragcache_testing.instant import InstantUpstream
from tests.errors import error_of
from tests.live_server import LiveServer

LONE_SURROGATE_BODY = b'{"inputs": ["fine", "a lone surrogate \\ud800"], "truncate": false}'


@pytest.fixture(scope="module")
def upstream():
    with InstantUpstream() as server:
        yield server


@pytest.mark.parametrize("tokenizer", [PACKAGED_MODEL, None], ids=["own tokenizer", "estimate"])
def test_a_lone_surrogate_for_a_remote_model_is_a_422_and_never_sent(upstream, tmp_path, tokenizer):
    models = json.loads(upstream.models_json)
    models["models"][0]["tokenizer"] = tokenizer
    settings = Settings(models_json=json.dumps(models), model=upstream.model, redis_url="off", milvus_uri="off",
                        data_dir=tmp_path, drift_check=False)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        response = http.post("/embed", content=LONE_SURROGATE_BODY, headers={"Content-Type": "application/json"})
        assert response.status_code == 422, response.text
        error = error_of(response)
        assert error["field"] == "inputs[1]" and "surrogate" in error["message"]
        assert texts_computed(http, upstream.model) == 0  # nothing was sent upstream
        assert http.post("/embed", json={"inputs": ["fine"]}).status_code == 200
        assert texts_computed(http, upstream.model) == 1


def texts_computed(http: httpx.Client, model: str) -> int:
    return http.get("/stats").json()["models"][model]["since_start"]["texts_computed"]


# Token ids for a remote model: tests/server/test_embed_remote_token_ids.py (sent upstream where its protocol takes
# them; a 400 saying to send text where it does not).
