"""Keep-warm that stays out of the users' way, against a real vLLM that schedules by priority: a due warm is held
while the endpoint's own /metrics shows users waiting, and goes once it shows none (its warms carry the priority
field, which this server takes; the session server in the other modules is FCFS and takes it too).

The order in which vLLM serves a warm and a later user request is not tested here: on two busy cores the API
server hands requests to the engine late and out of the order they were sent, so a test of it measured the
machine, not vLLM. tests/test_prefixes_unit.py pins the priority each warm carries."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, WarmOutcome
from ragcache_bench.prefixes import build_prefix_text
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

# The session server's shape (tests/vllm/conftest.py).
BLOCK_SIZE = 32
NUM_BLOCKS = 128
# Completion tokens of a request that keeps the server busy for a second or more (the model's max_model_len is 2048).
LONG = 1800

pytestmark = pytest.mark.vllm

FAST = dict(initial_rewarm_interval_s=0.2, min_rewarm_interval_s=0.1, max_rewarm_interval_s=1.0,
            warm_budget_per_minute=600, tick_interval_s=0.05, metrics_interval_s=0.5,
            store_refresh_interval_s=0.5, default_block_size=BLOCK_SIZE)


@pytest.fixture(scope="module")
def one_slot_priority_server(vllm_paths, tmp_path_factory):
    """A server that runs one request at a time (every other one queues) and serves the queue by priority."""
    python, model = vllm_paths
    server = VLLMServer(VLLMServerConfig(python=python, model=model, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS,
                                         scheduling_policy="priority", max_num_seqs=1,
                                         log_path=tmp_path_factory.mktemp("vllm-priority") / "server.log"))
    server.start()
    yield server
    server.stop()


def _registry(tmp_path, http, **settings) -> PrefixRegistry:
    return PrefixRegistry.create(PrefixRegistryConfig(file_path=tmp_path / "prefixes.json", **{**FAST, **settings}),
                                 http=http)


def _long_request(target: Target, max_tokens: int, done: dict[str, float], key: str) -> threading.Thread:
    """A user request that keeps the server busy for a while (``ignore_eos``), in a thread; ``done[key]`` is when
    its answer came back."""

    def send() -> None:
        with httpx.Client(timeout=120) as http:
            http.post(f"{target.base_url}/v1/completions",
                      json={"model": target.model, "prompt": "Tell a long story.", "max_tokens": max_tokens,
                            "ignore_eos": True}).raise_for_status()
        done[key] = time.monotonic()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _wait_for_load(registry: PrefixRegistry, url: str, *, running: int = 0, waiting: int = 0) -> None:
    """Until the endpoint's /metrics reports at least ``running`` and ``waiting`` requests (both 0: none at all)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        counters = registry.scrape(url)
        if counters is not None:
            now = (counters.num_running or 0, counters.num_waiting or 0)
            if (now == (0, 0)) if (running, waiting) == (0, 0) else (now[0] >= running and now[1] >= waiting):
                return
        time.sleep(0.02)
    raise AssertionError(f"{url} never reported {running} running and {waiting} waiting")


def test_a_due_warm_is_held_while_users_wait_then_goes(one_slot_priority_server, tmp_path, http):
    # One request runs at a time, so the users behind the first one wait: the endpoint reports them in
    # vllm:num_requests_waiting for seconds (on two busy cores /metrics itself may answer late, so the test
    # leaves it seconds of margin rather than timing single ticks).
    server = one_slot_priority_server
    target = Target(server.base_url, server.config.served_model_name)
    registry = _registry(tmp_path, http, warm_max_defer_s=120)  # the default hold: any request waiting
    registry.register(PrefixSpec("held", build_prefix_text(http, target, 300), target))  # the prime is never held
    time.sleep(0.3)  # the next warm is due now (initial interval 0.2 s)
    done: dict[str, float] = {}
    users = [_long_request(target, LONG, done, f"user-{i}") for i in range(3)]
    _wait_for_load(registry, target.base_url, running=1, waiting=2)
    assert registry.tick() == []
    assert registry.stats().num_warms_held_busy == 1
    assert registry.prefix_stats("held").num_warms == 1  # only the prime
    for user in users:
        user.join(timeout=120)
    _wait_for_load(registry, target.base_url)  # nothing running or waiting: the hold lets it go
    # Sent (the users' long answers may have pushed the prefix out of this small cache meanwhile).
    assert [w.outcome for w in registry.tick()] in ([WarmOutcome.RESIDENT], [WarmOutcome.EVICTED])
    assert registry.prefix_stats("held").num_warms == 2
