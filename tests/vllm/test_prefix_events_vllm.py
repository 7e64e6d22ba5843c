"""The registry on a real vLLM's KV events (issue 30; the session server publishes them, tests/vllm/conftest.py):
residency comes from the engine's own events, a churned-out prefix is seen evicted and warmed again, routing prefers
the replica that holds it (why-not-cached: tests/vllm/test_prefix_reasons_vllm.py)."""

from __future__ import annotations

import random

import pytest

from ragcache.prefixes import EventsConfig, PrefixRegistry, PrefixRegistryConfig, PrefixSpec, PromptForm
from ragcache_bench.prefixes import build_prefix_text
from tests.vllm.conftest import BLOCK_SIZE, started_with_events, wait_for

pytestmark = pytest.mark.vllm



def _started(vllm_server, http, tmp_path, **overrides):
    events = {vllm_server.base_url: EventsConfig(vllm_server.config.kv_events_endpoint,
                                                 vllm_server.config.kv_replay_endpoint)}
    config = PrefixRegistryConfig(file_path=tmp_path / "prefixes.json", initial_rewarm_interval_s=5.0,
                                  min_rewarm_interval_s=5.0, max_rewarm_interval_s=60.0, tick_interval_s=0.05,
                                  metrics_interval_s=0.5, default_block_size=BLOCK_SIZE, warm_max_waiting=None,
                                  kv_events=events, **overrides)
    return started_with_events(PrefixRegistry.create(config, http=http), vllm_server)


@pytest.fixture
def registry(vllm_server, http, tmp_path):
    reg = _started(vllm_server, http, tmp_path)
    yield reg
    reg.close()


@pytest.fixture
def registry_without_checks(vllm_server, http, tmp_path):
    """No warm goes out to check the events' claims (:mod:`ragcache.prefixes.trust`): with the default 10 s, one fell
    due on the avoided timer warm whenever starting and syncing took over 5 s (CI, round ten: 2 warms, not 1)."""
    reg = _started(vllm_server, http, tmp_path, verify_interval_s=3600.0)
    yield reg
    reg.close()


def _endpoint(registry: PrefixRegistry, name: str):
    return registry.prefix_stats(name).endpoints[0]


def _churn(http, target, seed: int) -> None:
    """Fill the whole KV cache (128 blocks of 32 = 4096 tokens) with token-id prompts nothing else shares."""
    rng = random.Random(seed)
    for _ in range(6):
        prompt = [rng.randrange(3, 8000) for _ in range(1024)]
        r = http.post(f"{target.base_url}/v1/completions", json={"model": target.model, "prompt": prompt, "max_tokens": 1})
        r.raise_for_status()


def test_events_drive_residency_and_a_churned_out_prefix_is_warmed_back(registry, http, target):
    registry.register(PrefixSpec("events-sys", build_prefix_text(http, target, 600), target))
    wait_for(lambda: (_endpoint(registry, "events-sys").num_blocks or 0) > 0 and
              _endpoint(registry, "events-sys").resident_blocks == _endpoint(registry, "events-sys").num_blocks,
              60, "the prefix's blocks in the engine's events")
    stats = _endpoint(registry, "events-sys")
    assert stats.events == "synced" and stats.num_blocks >= 600 // BLOCK_SIZE - 1
    route = registry.route("events-sys")
    assert (route.endpoint, route.reason) == (target.base_url, "resident")
    warms_before = registry.prefix_stats("events-sys").num_warms

    _churn(http, target, 1)  # evicts the prefix: the events show it, and the registry warms it on eviction
    seen_s = wait_for(lambda: registry.prefix_stats("events-sys").num_warms > warms_before, 60,
                       "a warm on eviction")
    print(f"a warm went out {seen_s:.2f}s after the churn ended")
    wait_for(lambda: _endpoint(registry, "events-sys").resident_blocks == _endpoint(registry, "events-sys").num_blocks,
              60, "the prefix resident again")
    assert _endpoint(registry, "events-sys").keepable


def test_no_timer_warm_while_the_events_show_the_prefix_whole(registry_without_checks, http, target):
    registry = registry_without_checks
    registry.register(PrefixSpec("events-quiet", build_prefix_text(http, target, 300), target))
    wait_for(lambda: _endpoint(registry, "events-quiet").resident_blocks == _endpoint(registry, "events-quiet").num_blocks
              and (_endpoint(registry, "events-quiet").num_blocks or 0) > 0, 60, "the prefix resident by the events")
    warms = registry.prefix_stats("events-quiet").num_warms
    # Its timer falls due 5 s after the prime (initial_rewarm_interval_s): the events say whole, so nothing is sent.
    wait_for(lambda: _endpoint(registry, "events-quiet").num_warms_avoided >= 1, 30, "the due warm avoided")
    assert registry.prefix_stats("events-quiet").num_warms == warms



def test_a_chat_prefix_is_resident_block_for_block_as_vllm_holds_it(registry, http, target):
    """Issue 42, item 1: ragcache read 0 of 12 blocks of a chat prefix while vLLM held 12 of 12 (it tokenized the prefix
    as a completion; a chat starts with the chat template's tokens). Now its count is vLLM's own: a chat on the prefix
    finds exactly the blocks ragcache reports resident."""
    registry.register(PrefixSpec("events-chat", build_prefix_text(http, target, 400), target, form=PromptForm.CHAT))
    wait_for(lambda: (_endpoint(registry, "events-chat").num_blocks or 0) > 0 and
              _endpoint(registry, "events-chat").resident_blocks == _endpoint(registry, "events-chat").num_blocks,
              60, "the chat prefix's blocks in the engine's events")
    stats = _endpoint(registry, "events-chat")
    messages = registry.messages("events-chat", "What does a KV cache hold?")
    r = http.post(f"{target.base_url}/v1/chat/completions", json={"model": target.model, "messages": messages, "max_tokens": 1})
    r.raise_for_status()
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    print(f"chat prefix: ragcache {stats.resident_blocks}/{stats.num_blocks} blocks; vLLM cached {cached} tokens")
    assert cached == stats.resident_blocks * BLOCK_SIZE and stats.num_blocks >= 400 // BLOCK_SIZE - 1
    assert registry.route("events-chat").reason == "resident"
