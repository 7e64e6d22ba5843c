"""Keep-warm that stays out of the users' way, against a real vLLM: warms wait behind user requests on a server
that schedules by priority, and a due warm is held while the endpoint's own /metrics shows users running."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, WarmOutcome
from ragcache_bench.prefixes import build_prefix_text
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

from .conftest import BLOCK_SIZE, NUM_BLOCKS

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
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        counters = registry.scrape(url)
        if counters and (counters.num_running or 0) >= running and (counters.num_waiting or 0) >= waiting:
            return
        time.sleep(0.02)
    raise AssertionError(f"{url} never reported {running} running and {waiting} waiting")


def test_a_due_warm_is_held_while_a_user_request_runs_then_goes(tmp_path, http, target):
    registry = _registry(tmp_path, http, warm_max_running=0, warm_max_defer_s=60)
    prefix_text = build_prefix_text(http, target, 300)
    registry.register(PrefixSpec("held", prefix_text, target))  # the prime goes out at once, held or not
    done: dict[str, float] = {}
    user = _long_request(target, 400, done, "user")
    _wait_for_load(registry, target.base_url, running=1)
    time.sleep(0.3)  # the warm is due now (initial interval 0.2 s)
    held_ticks = []
    while "user" not in done:
        held_ticks.append(registry.tick())
        time.sleep(0.05)
    user.join()
    # The last tick may have seen the request finish before its answer reached the thread.
    assert len(held_ticks) >= 3 and all(warms == [] for warms in held_ticks[:-1])
    assert registry.stats().num_warms_held_busy == 1  # one hold, however many ticks it lasted
    _wait_for_load(registry, target.base_url)  # the endpoint reports idle again
    time.sleep(0.3)
    warms = held_ticks[-1] or registry.tick()
    assert [w.outcome for w in warms] == [WarmOutcome.RESIDENT]


def test_a_held_warm_goes_anyway_after_warm_max_defer_s(tmp_path, http, target):
    registry = _registry(tmp_path, http, warm_max_running=0, warm_max_defer_s=0.5)
    registry.register(PrefixSpec("overdue", build_prefix_text(http, target, 300), target))
    done: dict[str, float] = {}
    user = _long_request(target, 400, done, "user")
    _wait_for_load(registry, target.base_url, running=1)
    time.sleep(0.3)
    assert registry.tick() == []  # due, and held: the endpoint is busy
    time.sleep(0.6)
    warms = registry.tick()
    assert "user" not in done, "the user request ended before the hold ran out: nothing was measured"
    assert [w.outcome for w in warms] == [WarmOutcome.RESIDENT]  # sent while the user request still runs
    user.join()


def test_a_warm_waits_behind_a_later_user_request_on_a_priority_server(one_slot_priority_server, tmp_path, http):
    server = one_slot_priority_server
    target = Target(server.base_url, server.config.served_model_name)
    registry = _registry(tmp_path, http)  # defaults: warms at priority 1,000,000
    registry.register(PrefixSpec("low", build_prefix_text(http, target, 300), target))
    done: dict[str, float] = {}
    blocker = _long_request(target, 600, done, "blocker")  # takes the only slot
    _wait_for_load(registry, target.base_url, running=1)

    def warm() -> None:
        registry.warm("low")
        done["warm"] = time.monotonic()

    warm_thread = threading.Thread(target=warm, daemon=True)
    warm_thread.start()
    _wait_for_load(registry, target.base_url, running=1, waiting=1)  # the warm queues first
    user = _long_request(target, 1, done, "user")  # a user request that arrives after it, at priority 0
    _wait_for_load(registry, target.base_url, running=1, waiting=2)
    for thread in (blocker, warm_thread, user):
        thread.join(timeout=120)
    # First come would serve the warm first; by priority the later user request goes ahead of it.
    assert done["blocker"] < done["user"] < done["warm"]
    assert registry.prefix_stats("low").last_outcome is WarmOutcome.RESIDENT
