"""Token-id input for a remote model (issue 39.4: "a remote model: passed upstream"): through the real OpenAI SDK, a
service whose model is an OpenAI-compatible upstream on loopback sends the ids upstream as ids, caches them under keys
of their own (two identical id lists: one upstream call; the same digits as text: another key) and counts them in
``usage``; a remote kind whose protocol takes no ids (Ollama's native route) is a 400 that says to send text, and
nothing is sent. The upstream is a loopback server that answers OpenAI's wire format and keeps what it received."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
import xxhash

from ragcache.settings import Settings
from tests.live_server import LiveServer
from tests.models.remote.loopback import LoopbackServer, Received, Reply

MODEL = "ids-upstream"
DIM = 8


def _vector(item: object) -> list[float]:
    """A vector per input as the upstream received it: ids and text of the same digits get different vectors."""
    seed = xxhash.xxh3_64_intdigest(json.dumps(item).encode())
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32).tolist()


def _openai_answer(request: Received) -> Reply:
    inputs = request.body["input"]
    inputs = inputs if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else [inputs]
    data = [{"object": "embedding", "index": index, "embedding": _vector(item)} for index, item in enumerate(inputs)]
    return Reply(body={"object": "list", "data": data, "model": MODEL, "usage": {"prompt_tokens": 1, "total_tokens": 1}})


@pytest.fixture(scope="module")
def upstream():
    with LoopbackServer(_openai_answer) as server:
        yield server


@pytest.fixture(scope="module")
def service(upstream, tmp_path_factory):
    model = {"name": MODEL, "provider": "openai", "base_url": upstream.url + "/v1", "upstream_model": MODEL,
             "dimensions": DIM, "max_input_tokens": 16}
    settings = Settings(models_json=json.dumps({"models": [model]}), model=MODEL, redis_url="off", milvus_uri="off",
                        data_dir=tmp_path_factory.mktemp("ids"), drift_check=False)
    with LiveServer(settings) as server:
        yield server


def test_token_ids_for_a_remote_model_go_upstream_as_ids_and_are_cached_under_their_own_keys(upstream, service):
    client = openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0)
    rows = [[101, 7592, 102], [101, 2023, 2003, 102]]
    first = client.embeddings.create(model=MODEL, input=rows)
    assert [request.body["input"] for request in upstream.received] == [rows]  # ids, not text, in one request
    assert [item.embedding for item in first.data] == [_vector(row) for row in rows]  # float32, bit for bit
    assert first.usage.prompt_tokens == 7  # the ids are the tokens

    again = client.embeddings.create(model=MODEL, input=rows)  # two identical id lists: both hits
    one = client.embeddings.create(model=MODEL, input=rows[0])  # one text's ids: the same key as its row
    assert len(upstream.received) == 1
    assert [item.embedding for item in again.data] == [item.embedding for item in first.data]
    assert one.data[0].embedding == first.data[0].embedding

    as_text = client.embeddings.create(model=MODEL, input="101 7592 102")  # the digits as text: a key of its own
    assert upstream.received[-1].body["input"] == ["101 7592 102"] and len(upstream.received) == 2
    assert as_text.data[0].embedding != first.data[0].embedding


def test_token_ids_over_the_model_length_are_a_413_when_not_truncating_and_cut_on_the_left(upstream, service):
    with httpx.Client(base_url=service.url, timeout=60) as http:
        long = list(range(1, 21))  # max_input_tokens 16
        response = http.post("/embed", json={"inputs": [long], "truncate": False})
        assert response.status_code == 413 and response.json()["field"] == "inputs[0]", response.text
        sent = len(upstream.received)
        response = http.post("/embed", json={"inputs": [long], "truncation_direction": "left"})
        assert response.status_code == 200, response.text
        assert upstream.received[sent].body["input"] == [long[-16:]]


def test_token_ids_for_a_remote_kind_that_takes_none_are_a_400_saying_to_send_text(tmp_path):
    """Ollama's native /api/embed takes text only: the ids are refused at the edge and nothing goes out."""
    with LoopbackServer(lambda request: Reply(status=500)) as upstream:
        model = {"name": "native", "provider": "ollama", "base_url": upstream.url, "upstream_model": "m", "dimensions": DIM}
        settings = Settings(models_json=json.dumps({"models": [model]}), model="native", redis_url="off", milvus_uri="off",
                            data_dir=tmp_path, drift_check=False)
        with LiveServer(settings) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.BadRequestError) as refused:
                client.embeddings.create(model="native", input=[[101, 7592, 102]])
            assert refused.value.param == "input" and "send text" in refused.value.message
            assert "takes none" in refused.value.message
            assert upstream.received == []


def test_token_ids_to_a_real_upstream_that_takes_text_only_are_its_refusal_and_text_still_serves(tmp_path):
    """Infinity speaks OpenAI's route but reads text only: its refusal of the ids comes back as a 502 quoting it (not a
    vector for some text), and the same service still embeds text through it."""
    from ragcache_testing.infinity import packaged_model_folder
    from tests.conftest import running_infinity

    with running_infinity(packaged_model_folder(), tmp_path) as infinity:
        model = {"name": "minilm-remote", "provider": "openai", "base_url": infinity.base_url,
                 "upstream_model": infinity.model_id, "dimensions": 384, "normalize": True}
        settings = Settings(models_json=json.dumps({"models": [model]}), model="minilm-remote", redis_url="off",
                            milvus_uri="off", data_dir=tmp_path / "data", drift_check=False)
        with LiveServer(settings) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.InternalServerError) as refused:
                client.embeddings.create(model="minilm-remote", input=[[101, 7592, 102]])
            assert refused.value.status_code == 502 and refused.value.code == "upstream_bad_response"
            assert len(client.embeddings.create(model="minilm-remote", input="hello").data[0].embedding) == 384
