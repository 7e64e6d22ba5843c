"""The prefix registry against a real vLLM (tiny random Llama on CPU) and a real Redis."""

from __future__ import annotations

import functools
import time

import pytest

from ragcache.prefixes import (
    PrefixRegistry,
    PrefixRegistryConfig,
    PrefixSpec,
    WarmOutcome,
)
from ragcache.prefixes.policy import judge_residency
from ragcache.prefixes.tokens import LocalTokenCounter
from ragcache_bench.prefixes import ChurnConfig, build_prefix_text, count_tokens, run_side_by_side
from tests.vllm.conftest import BLOCK_SIZE, wait_for

pytestmark = pytest.mark.vllm

FAST = dict(initial_rewarm_interval_s=0.2, min_rewarm_interval_s=0.1, max_rewarm_interval_s=1.0,
            warm_budget_per_minute=600, tick_interval_s=0.05, metrics_interval_s=0.5,
            backoff_min_s=0.5, backoff_max_s=2.0, store_refresh_interval_s=0.5,
            default_block_size=BLOCK_SIZE)


@pytest.fixture
def registry(redis_client, http, tmp_path):
    reg = PrefixRegistry.create(PrefixRegistryConfig(file_path=tmp_path / "unused.json", **FAST),
                                redis_client=redis_client, http=http)
    yield reg
    reg.close()


@pytest.fixture
def prefix_text(http, target) -> str:
    return build_prefix_text(http, target, 600)


def _user_request(http, target, prompt: str) -> dict:
    r = http.post(f"{target.base_url}/v1/completions",
                  json={"model": target.model, "prompt": prompt, "max_tokens": 1})
    r.raise_for_status()
    return r.json()["usage"]



def test_registered_prefix_is_warmed_and_next_request_hits(registry, http, target, prefix_text):
    tmpl = prefix_text + "{document}\nQuestion: {question}\n"
    result = registry.register(PrefixSpec("rag", tmpl, target, is_template=True))
    num_tokens = count_tokens(http, target, prefix_text)
    assert result.created and result.new_version and result.prefix.version == 1
    assert result.prefix.num_tokens == num_tokens
    assert result.warm is not None and result.warm.outcome is WarmOutcome.PRIME
    assert result.warm.num_prompt_tokens == num_tokens

    before = registry.scrape(target.base_url)
    prompt = registry.render("rag", document="Paris is in France.", question="Where is Paris?")
    assert prompt.startswith(prefix_text)
    usage = _user_request(http, target, prompt)
    full_blocks = (num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert usage["prompt_tokens_details"]["cached_tokens"] >= full_blocks > 0
    after = registry.scrape(target.base_url)
    assert after.block_size == BLOCK_SIZE
    assert after.hits - before.hits >= full_blocks  # vLLM's own counters saw the hit too

    again = registry.warm("rag")
    assert again.outcome is WarmOutcome.RESIDENT
    stats = registry.prefix_stats("rag")
    assert (stats.num_warms, stats.num_resident, stats.residency_rate, stats.num_uses) == (2, 1, 1.0, 1)


def test_local_tokenizer_agrees_with_vllm_tokenize(vllm_paths, http, target, prefix_text):
    counter = LocalTokenCounter({target.model: str(vllm_paths[1])})
    assert counter(target, prefix_text) == count_tokens(http, target, prefix_text)


def test_new_text_makes_new_version_and_old_is_no_longer_warmed(registry, http, target, prefix_text):
    registry.register(PrefixSpec("sys", prefix_text, target))
    second = registry.register(PrefixSpec("sys", prefix_text + "Be brief.\n", target))
    assert (second.new_version, second.prefix.version) == (True, 2)
    assert second.warm is not None and second.warm.outcome is WarmOutcome.PRIME
    assert registry.get("sys").text.endswith("Be brief.\n")
    assert [p.version for p in registry.list()] == [2]


def test_two_replicas_share_the_registry_through_redis(registry, redis_client, http, target, prefix_text):
    other = PrefixRegistry.create(PrefixRegistryConfig(**FAST), redis_client=redis_client, http=http)
    registry.register(PrefixSpec("shared", prefix_text, target))
    assert other.get("shared") == registry.get("shared")
    other.delete("shared")
    assert registry.list() == []


def test_pinned_prefix_stays_resident_under_churn_unpinned_is_evicted(registry, http, target, prefix_text):
    registry.start()
    # 20 rounds: the first few re-warms are spent learning how long the prefix survives this churn.
    churn = ChurnConfig(num_rounds=20, churn_per_round=5, churn_tokens=1024, churn_interval_s=0.15)
    texts = {True: prefix_text, False: prefix_text.replace("retrieval assistant", "research assistant", 1)}
    results, _ = run_side_by_side(registry, http, target, texts, churn, block_size=BLOCK_SIZE)
    pinned, unpinned = results[True], results[False]
    print(f"hit rate pinned={pinned.hit_rate:.2f} unpinned={unpinned.hit_rate:.2f} warms={pinned.num_warms}")
    # 5 x 1024 churn tokens per round are more than the 4096-token KV cache: without keep-warm the
    # prefix is gone by the time each user request comes, on the same churn that the pinned one survives.
    assert unpinned.hit_rate <= 0.1 and unpinned.num_warms == 0
    assert pinned.hit_rate >= 0.8
    assert pinned.num_warms >= churn.num_rounds
    # A pinned hit skips the prefix's prefill, so it is faster than an evicted one.
    assert sorted(pinned.latencies_hit_s)[len(pinned.latencies_hit_s) // 2] < \
        sorted(unpinned.latencies_miss_s)[len(unpinned.latencies_miss_s) // 2]


def test_vllm_restart_is_detected_and_prefix_rewarmed(registry, vllm_server, http, target, prefix_text):
    registry.register(PrefixSpec("survivor", prefix_text, target))
    registry.start()
    vllm_server.stop()
    wait_for(lambda: not _target(registry, target).up, 30, "the target to be reported down")
    assert registry.get("survivor").version == 1  # the entry is kept while vLLM is down
    down_result = registry.register(PrefixSpec("registered-while-down", prefix_text + "Extra.\n", target))
    assert down_result.warm is not None and down_result.warm.outcome in (WarmOutcome.ERROR, WarmOutcome.SKIPPED)

    restarted_at = time.time()
    vllm_server.start()
    wait_for(lambda: _target(registry, target).up, 60, "the target to be reported up again")
    def rewarmed(name: str) -> bool:
        stats = registry.prefix_stats(name)
        return (stats.last_warm_at or 0) > restarted_at and stats.last_outcome is not WarmOutcome.ERROR

    for name in ("survivor", "registered-while-down"):
        wait_for(functools.partial(rewarmed, name), 30, f"{name} re-warmed")
    num_tokens = count_tokens(http, target, prefix_text)
    usage = _user_request(http, target, prefix_text + "After the restart?")
    assert judge_residency(num_tokens, usage["prompt_tokens_details"]["cached_tokens"], BLOCK_SIZE)
    # Counted by vLLM's tokenizer on the first warm after the restart, since /tokenize was down.
    assert registry.get("registered-while-down").num_tokens == count_tokens(http, target, prefix_text + "Extra.\n")


def _target(registry, target):
    return next(t for t in registry.stats().targets if t.base_url == target.base_url)
