"""Fleets against real vLLM servers (two replicas of the tiny model, small KV caches): a prefix kept warm on
both, churn on one of them, and two real ragcache processes sharing one Redis and one warm schedule."""

from __future__ import annotations

import random
import signal
import threading
import time

import httpx
import pytest

from ragcache.prefixes import FilePrefixStore, PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, VLLMClient
from ragcache.prefixes.policy import judge_residency
from ragcache.prefixes.results import WarmOutcome
from ragcache_bench.prefixes import build_prefix_text, count_tokens
from ragcache_testing.service import ServiceProcess
from tests.vllm.conftest import BLOCK_SIZE, events_of, wait_for

pytestmark = pytest.mark.vllm


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def churn(http: httpx.Client, target: Target, num_prompts: int = 5, num_tokens: int = 1024) -> None:
    """Unique random-token prompts: 5 x 1,024 tokens cycle the whole 4,096-token KV cache of the server."""
    rng = random.Random()
    for _ in range(num_prompts):
        prompt = [rng.randrange(3, 8192) for _ in range(num_tokens)]
        http.post(f"{target.base_url}/v1/completions",
                  json={"model": target.model, "prompt": prompt, "max_tokens": 1}).raise_for_status()


def cached_tokens(http: httpx.Client, target: Target, prompt: str) -> int:
    r = http.post(f"{target.base_url}/v1/completions", json={"model": target.model, "prompt": prompt, "max_tokens": 1})
    r.raise_for_status()
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_churn_on_one_replica_evicts_only_there_and_only_that_one_is_rewarmed(
        vllm_server, second_vllm_server, http, tmp_path):
    a = Target(vllm_server.base_url, vllm_server.config.served_model_name)
    b = Target(second_vllm_server.base_url, a.model)
    clock = Clock()
    config = PrefixRegistryConfig(initial_rewarm_interval_s=8.0, min_rewarm_interval_s=2.0, max_rewarm_interval_s=16.0,
                                  default_block_size=BLOCK_SIZE, store_refresh_interval_s=0.0,
                                  metrics_interval_s=1e9)
    registry = PrefixRegistry(FilePrefixStore(tmp_path / "prefixes.json"), VLLMClient(http), config,
                              clock=clock, wall_clock=clock)
    text = build_prefix_text(http, a, 600)
    registered = registry.register(PrefixSpec("fleet", text, a, endpoints=(b.base_url,)))
    assert [(w.endpoint, w.outcome) for w in registered.warms] == [(a.base_url, WarmOutcome.PRIME),
                                                                     (b.base_url, WarmOutcome.PRIME)]
    clock.now += 8
    assert {w.outcome for w in registry.tick()} == {WarmOutcome.RESIDENT}

    churn(http, a)  # real traffic on replica A only
    clock.now += 12
    outcomes = {w.endpoint: w.outcome for w in registry.tick()}
    assert outcomes == {a.base_url: WarmOutcome.EVICTED, b.base_url: WarmOutcome.RESIDENT}

    clock.now += 6  # A's interval was halved by the eviction; B's grew
    assert [(w.endpoint, w.outcome) for w in registry.tick()] == [(a.base_url, WarmOutcome.RESIDENT)]
    endpoints = {e.base_url: e for e in registry.prefix_stats("fleet").endpoints}
    assert (endpoints[a.base_url].num_evicted, endpoints[a.base_url].num_warms) == (1, 4)
    assert (endpoints[b.base_url].num_evicted, endpoints[b.base_url].num_warms) == (0, 3)  # not warmed needlessly
    num_tokens = count_tokens(http, a, text)
    for target in (a, b):  # both replicas serve the prefix from cache now
        assert judge_residency(num_tokens, cached_tokens(http, target, text + "Why?"), BLOCK_SIZE)


def completed_requests(http: httpx.Client, target: Target) -> float:
    """vLLM's own count of finished requests (every reason), from /metrics."""
    text = http.get(f"{target.base_url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def warms_by_endpoint(replica: ServiceProcess) -> dict[str, int]:
    stats = replica.client.get("/prefixes/fleet/stats").json()
    return {e["base_url"]: e["num_warms"] for e in stats["endpoints"]}



LEASE_TTL_S = 3.0


@pytest.fixture
def ragcache_pair(redis_url, tmp_path):
    env = {"RAGCACHE_MILVUS_URI": "off", "RAGCACHE_DRIFT_CHECK": "false",
           "RAGCACHE_PREFIX_MIN_REWARM_INTERVAL_S": "0.5", "RAGCACHE_PREFIX_MAX_REWARM_INTERVAL_S": "1.0",
           "RAGCACHE_PREFIX_LEASE_TTL_S": str(LEASE_TTL_S),
           # A 1 s timer on a quiet fleet is far above what the engines' figures call for (a sized budget holds it to
           # 12 a minute, and the dead holder's warms would then fill the survivor's minute): this test is about one
           # schedule and its take-over, so its budget is the fixed 120.
           "RAGCACHE_PREFIX_WARM_BUDGET_SIZED": "false"}
    replicas = [ServiceProcess(tmp_path, redis_url=redis_url, extra_env=env) for _ in range(2)]
    yield replicas
    for replica in replicas:
        replica.stop()


def test_two_ragcache_replicas_send_one_schedule_and_a_survivor_takes_over(
        vllm_server, second_vllm_server, ragcache_pair, http):
    a = Target(vllm_server.base_url, vllm_server.config.served_model_name)
    b = Target(second_vllm_server.base_url, a.model)
    first, second = ragcache_pair
    body = {"name": "fleet", "text": build_prefix_text(http, a, 300), "endpoints": [b.base_url],
            "target": {"base_url": a.base_url, "model": a.model}}
    assert first.client.post("/prefixes", json=body).status_code == 201
    time.sleep(2.0)  # both replicas' loops have seen the prefix; the leases are taken

    servers_before = sum(completed_requests(http, t) for t in (a, b))
    before = [warms_by_endpoint(r) for r in ragcache_pair]
    time.sleep(6.0)
    after = [warms_by_endpoint(r) for r in ragcache_pair]
    servers_after = sum(completed_requests(http, t) for t in (a, b))
    sent = [sum(after[i].values()) - sum(before[i].values()) for i in range(2)]
    at_servers = servers_after - servers_before
    print(f"warms sent by the replicas over 6 s: {sent}; requests counted by the vLLM servers: {at_servers}")
    holder, other = (0, 1) if sent[0] else (1, 0)
    assert sent[other] == 0 and sent[holder] >= 6  # one schedule: ~1 warm/s on each of two endpoints
    assert abs(at_servers - sent[holder]) <= 2  # a warm in flight at either edge of the window

    survivor = ragcache_pair[other]
    start = warms_by_endpoint(survivor)
    ragcache_pair[holder].process.kill()  # dies without a word: its leases only expire
    wait_for(lambda: all(n > start[url] for url, n in warms_by_endpoint(survivor).items()),
              LEASE_TTL_S + 15, "the survivor to warm both endpoints")


def _whole(registry: PrefixRegistry, name: str, url: str) -> bool:
    view = next(r for r in registry.view(name).residency if r.base_url == url)
    return (view.num_blocks or 0) > 0 and view.resident_blocks == view.num_blocks


def _rewarmed_after_churn(registry: PrefixRegistry, http: httpx.Client, target: Target, name: str) -> float:
    """Churn ``target`` until the events show ``name`` evicted there; seconds until they show it whole again."""
    while _whole(registry, name, target.base_url):
        churn(http, target, num_prompts=1)
    evicted_at = time.monotonic()
    try:
        wait_for(lambda: _whole(registry, name, target.base_url), 60, f"{name} whole again on {target.base_url}")
    except AssertionError as exc:  # say why: the prefix's residency and reasons as the registry sees them
        raise AssertionError(f"{exc}; {registry.view(name)}") from exc
    return time.monotonic() - evicted_at


def test_a_frozen_replica_costs_only_its_own_and_a_restarted_one_is_never_stale(
        vllm_server, second_vllm_server, tmp_path):
    """Issue 42, items 3 and 2, on two real replicas publishing KV events. With B SIGSTOPped, an eviction on A was
    re-warmed only after 6.1-6.3 s (0.21 s normally): one loop read B's /metrics with a 30 s timeout. And for 18-23 s
    after B restarted empty, ragcache reported the dead engine's blocks as held by the new one."""
    a = Target(vllm_server.base_url, vllm_server.config.served_model_name)
    b = Target(second_vllm_server.base_url, a.model)
    config = PrefixRegistryConfig(file_path=tmp_path / "prefixes.json", initial_rewarm_interval_s=30.0,
                                  min_rewarm_interval_s=5.0, max_rewarm_interval_s=60.0, tick_interval_s=0.05,
                                  metrics_interval_s=0.5, default_block_size=BLOCK_SIZE, warm_max_waiting=None,
                                  # The churn below evicts "kept" on A as fast as it can, and the events re-warm it
                                  # within ~0.05 s, often before the churn loop looks: three evictions within 1 s of
                                  # a warm would judge it not keepable and stop its warms for 60 s (CI saw the 60 s
                                  # wait run out). Keepability has its own tests; this one measures re-warm delays.
                                  unkeepable_after=1_000_000,
                                  kv_events=events_of(vllm_server, second_vllm_server))
    with httpx.Client(timeout=120) as http:
        registry = PrefixRegistry.create(config, http=http)
        registry.start()
        try:
            for url in (a.base_url, b.base_url):
                subscriber = registry._keep_warm.engines.subscriber(url)
                assert subscriber is not None
                wait_for(lambda subscriber=subscriber: subscriber.synced, 30, f"the events of {url} synced")
            text = build_prefix_text(http, a, 600)
            registry.register(PrefixSpec("kept", text, a, endpoints=(b.base_url,)))
            # Another prompt from its first token on: none of its blocks is one of "kept"'s.
            other = "A prompt of its own, sharing nothing with the other one.\n" + text[: len(text) // 2]
            registry.register(PrefixSpec("left", other, a, pinned=False, endpoints=(b.base_url,)))
            registry.warm("left", b.base_url)  # on B only, and never again (not pinned)
            for name, url in (("kept", a.base_url), ("kept", b.base_url), ("left", b.base_url)):
                wait_for(lambda name=name, url=url: _whole(registry, name, url), 60, f"{name} whole on {url}")

            normal_s = _rewarmed_after_churn(registry, http, a, "kept")
            second_vllm_server.signal(signal.SIGSTOP)
            try:
                frozen_s = _rewarmed_after_churn(registry, http, a, "kept")
                assert _whole(registry, "kept", a.base_url)  # re-warmed on A while B is still frozen
            finally:
                second_vllm_server.signal(signal.SIGCONT)
            print(f"A's re-warm after an eviction: {normal_s:.2f} s normally, {frozen_s:.2f} s with B frozen")

            second_vllm_server.signal(signal.SIGKILL)
            seen: list[tuple[str, int | None]] = []
            done = threading.Event()

            def watch() -> None:  # B's residency of "left" from the kill until B is back and synced
                while not done.is_set():
                    view = next(r for r in registry.view("left").residency if r.base_url == b.base_url)
                    seen.append((view.events, view.resident_blocks))
                    time.sleep(0.02)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            second_vllm_server.start()  # the same ports and sockets, an empty engine
            subscriber = registry._keep_warm.engines.subscriber(b.base_url)
            assert subscriber is not None
            wait_for(lambda: subscriber.synced and subscriber.num_new_streams >= 1, 60, "B's events synced again")
            wait_for(lambda: _whole(registry, "kept", b.base_url), 60, "the pinned prefix warmed again on the new B")
            done.set()
            watcher.join()
            # Until the subscriber hears that B died (its socket closed: a few ms), it reads what B last held; from
            # then on, nothing: out of sync, syncing, then synced with the new, empty engine's blocks.
            noticed = next(i for i, (events, _) in enumerate(seen) if events != "synced")
            after = seen[noticed:]
            print(f"B's residency of the unpinned prefix, every 20 ms from the kill on: {noticed} samples before the "
                  f"death was noticed, then {sorted(set(after))}")
            assert [(events, blocks) for events, blocks in after if blocks] == []  # never the dead engine's blocks
            assert after[-1] == ("synced", 0)
        finally:
            registry.close()
