"""The prefix routes and the Python client, end to end: client -> FastAPI router -> registry -> real vLLM."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ragcache.client import Client
from ragcache.errors import NotFoundError
from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PromptForm, WarmOutcome
from ragcache_bench.prefixes import build_prefix_text
from ragcache_server.prefixes_api import router
from tests.live_server import transport_to

pytestmark = pytest.mark.vllm


@pytest.fixture
def client(redis_client, http, tmp_path):
    registry = PrefixRegistry.create(PrefixRegistryConfig(default_block_size=32), redis_client=redis_client, http=http)
    app = FastAPI()
    app.state.prefixes = registry

    @app.exception_handler(NotFoundError)
    def not_found(request, exc):
        from fastapi.responses import JSONResponse

        return JSONResponse({"error": {"message": str(exc)}}, status_code=404)

    app.include_router(router)
    with TestClient(app) as test_client:
        yield Client("http://ragcache.test", transport=transport_to(test_client))
    registry.close()


def test_client_registers_renders_and_the_rendered_prompt_hits(client, http, target):
    head = build_prefix_text(http, target, 400)
    answer = client.register_prefix("rag", head + "{document}\nQ: {question}\n", target, is_template=True)
    assert answer.warm.outcome is WarmOutcome.PRIME and answer.warnings == ()
    prompt = client.render("rag", document="Milvus stores vectors.", question="What stores vectors?")
    assert prompt.startswith(head)
    r = http.post(f"{target.base_url}/v1/completions", json={"model": target.model, "prompt": prompt, "max_tokens": 1})
    usage = r.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (answer.prefix.num_tokens - 1) // 32 * 32 > 0
    assert client.warm_prefix("rag").outcome is WarmOutcome.RESIDENT
    client.flush_uses()
    stats = client.prefix_stats("rag")
    assert (stats["num_uses"], stats["num_resident"], stats["residency_rate"]) == (1, 1, 1.0)
    client.delete_prefix("rag")
    with pytest.raises(NotFoundError):
        client.get_prefix("rag")


def test_chat_form_prefix_is_warmed_as_the_system_message(client, http, target):
    system = build_prefix_text(http, target, 400)
    answer = client.register_prefix("chat", system, target, form=PromptForm.CHAT)
    assert answer.warm.outcome is WarmOutcome.PRIME
    messages = client.messages("chat", "What is a KV cache?")
    assert messages[0] == {"role": "system", "content": system}
    r = http.post(f"{target.base_url}/v1/chat/completions",
                  json={"model": target.model, "messages": messages, "max_tokens": 1})
    usage = r.json()["usage"]
    # The chat template renders the system turn first, so the warmed blocks are the request's first blocks.
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached >= answer.warm.num_prompt_tokens // 32 * 32 - 32 and cached > 0
