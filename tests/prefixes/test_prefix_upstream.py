"""The vLLM behind a prefix answers what vLLM never sends (issue 20, finding 10): registering the prefix is a
clear 502 naming vLLM, never a 500; through the real service over HTTP, against a loopback "vLLM"."""

from __future__ import annotations

import httpx
import pytest

from ragcache.prefixes import PromptForm, Target, TargetBadResponseError, VLLMClient
from ragcache.settings import Settings
from tests.live_server import LiveServer
from tests.models.remote.loopback import LoopbackServer, Received, Reply

TOKENIZE_ANSWERS = {
    "no-count": {"tokens": [1, 2, 3]},  # an older or foreign server: no "count"
    "count-not-int": {"count": "three"},
    "not-an-object": [1, 2, 3],
    "not-json": b"<html>proxy error</html>",
}


def fake_vllm(request: Received) -> Reply:
    if request.path == "/tokenize":
        return Reply(200, TOKENIZE_ANSWERS[request.body["model"]])
    return Reply(200, {"usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}})


@pytest.fixture(scope="module")
def vllm():
    with LoopbackServer(fake_vllm) as server:
        yield server


@pytest.fixture(scope="module")
def service(vllm, tmp_path_factory):
    with LiveServer(Settings(redis_url="off", milvus_uri="off", data_dir=tmp_path_factory.mktemp("data"))) as server:
        yield server


@pytest.mark.parametrize("answer", sorted(TOKENIZE_ANSWERS))
def test_a_tokenize_answer_vllm_never_sends_is_a_502_naming_vllm(service, vllm, answer, caplog):
    spec = {"name": f"bad-tokenize-{answer}", "text": "You answer from the context only.\n", "pinned": False,
            "target": {"base_url": vllm.url, "model": answer}}
    response = httpx.post(f"{service.url}/prefixes", json=spec, timeout=30)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["type"] == "upstream_bad_response" and "vLLM" in error["message"] and "/tokenize" in error["message"]
    assert "POST /prefixes failed" in caplog.text and not any(record.exc_info for record in caplog.records)  # one line


def test_the_client_refuses_a_malformed_completion_usage_naming_vllm(vllm):
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"usage": {"prompt_tokens": 3, "prompt_tokens_details": ["not", "an", "object"]}})

    client = VLLMClient(httpx.Client(transport=httpx.MockTransport(answer)))
    with pytest.raises(TargetBadResponseError, match="vLLM"):
        client.complete_one(Target(vllm.url, "m"), "x", PromptForm.COMPLETION)
