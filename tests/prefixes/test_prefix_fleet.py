"""Fleets: a prefix on several vLLM endpoints (each on its own schedule), and several ragcache replicas sharing
one warm schedule through leases in a real Redis. Fake vLLMs behind ``httpx.MockTransport`` and a fake clock;
the same behaviour against real vLLM servers and real replicas is in tests/vllm/test_prefix_fleet_vllm.py.
"""

from __future__ import annotations

import time

import httpx
import pytest

from ragcache.errors import InvalidInputError
from ragcache.prefixes import FilePrefixStore, PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, VLLMClient
from ragcache.prefixes.lease import RedisWarmGate
from ragcache.prefixes.results import WarmOutcome
from ragcache.prefixes.store import RedisPrefixStore
from tests.prefixes.test_prefixes_unit import CONFIG, SYSTEM, FakeClock, FakeVLLM

A, B, C = "http://vllm-a.test", "http://vllm-b.test", "http://vllm-c.test"


class Fleet:
    """One fake vLLM per host."""

    def __init__(self, *urls: str) -> None:
        self.servers = {httpx.URL(url).host: FakeVLLM() for url in urls}

    def __getitem__(self, url: str) -> FakeVLLM:
        return self.servers[httpx.URL(url).host]

    def handler(self, request: httpx.Request) -> httpx.Response:
        return self.servers[request.url.host].handler(request)

    def client(self) -> VLLMClient:
        return VLLMClient(httpx.Client(transport=httpx.MockTransport(self.handler)))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet() -> Fleet:
    return Fleet(A, B, C)


def registry_for(fleet, clock, tmp_path, **config) -> PrefixRegistry:
    merged = PrefixRegistryConfig(**{**CONFIG.__dict__, **config})
    return PrefixRegistry(FilePrefixStore(tmp_path / "prefixes.json"), fleet.client(), merged,
                          clock=clock, wall_clock=clock)


def by_url(stats) -> dict:
    return {endpoint.base_url: endpoint for endpoint in stats.endpoints}


def test_each_endpoint_is_warmed_on_its_own_schedule_and_an_eviction_rewarms_only_there(fleet, clock, tmp_path):
    registry = registry_for(fleet, clock, tmp_path)
    result = registry.register(PrefixSpec("p", SYSTEM, Target(A, "m"), endpoints=(B,)))
    assert [(w.endpoint, w.outcome) for w in result.warms] == [(A, WarmOutcome.PRIME), (B, WarmOutcome.PRIME)]
    assert result.warm == result.warms[0] and result.prefix.endpoints == (B,)
    clock.now += 8  # the initial interval: both due
    assert {(w.endpoint, w.outcome) for w in registry.tick()} == {(A, WarmOutcome.RESIDENT), (B, WarmOutcome.RESIDENT)}

    fleet[A].evict_all()  # traffic on A alone churns its KV cache
    clock.now += 12
    assert {(w.endpoint, w.outcome) for w in registry.tick()} == {(A, WarmOutcome.EVICTED), (B, WarmOutcome.RESIDENT)}
    endpoints = by_url(registry.prefix_stats("p"))
    assert (endpoints[A].resident, endpoints[A].num_evicted, endpoints[A].rewarm_interval_s) == (False, 1, 6.0)
    assert (endpoints[B].resident, endpoints[B].num_evicted, endpoints[B].rewarm_interval_s) == (True, 0, 16.0)

    b_prompts = len(fleet[B].prompts)
    clock.now += 6  # A's shortened interval: A is re-warmed, B is not due and is left alone
    assert [(w.endpoint, w.outcome) for w in registry.tick()] == [(A, WarmOutcome.RESIDENT)]
    assert len(fleet[B].prompts) == b_prompts
    stats = registry.prefix_stats("p")
    assert (stats.num_warms, stats.num_evicted, stats.num_resident) == (7, 1, 4)
    assert by_url(stats)[A].last_warm_at == clock.now > by_url(stats)[B].last_warm_at
    assert {t.base_url for t in registry.stats().targets} == {A, B}


def test_a_deployment_wide_list_applies_to_prefixes_whose_target_is_on_it(fleet, clock, tmp_path):
    registry = registry_for(fleet, clock, tmp_path, endpoints=(A + "/", B))
    on_fleet = registry.register(PrefixSpec("fleet", SYSTEM, Target(B, "m")))
    elsewhere = registry.register(PrefixSpec("alone", SYSTEM + " Alone.", Target(C, "m")))
    assert [w.endpoint for w in on_fleet.warms] == [B, A]  # the target first
    assert [w.endpoint for w in elsewhere.warms] == [C]
    assert fleet[A].prompts == [SYSTEM] and fleet[C].prompts == [SYSTEM + " Alone."]


def test_warming_an_endpoint_the_prefix_is_not_on_is_refused(fleet, clock, tmp_path):
    registry = registry_for(fleet, clock, tmp_path)
    registry.register(PrefixSpec("p", SYSTEM, Target(A, "m"), endpoints=(B,)))
    assert registry.warm("p", B + "/").endpoint == B
    with pytest.raises(InvalidInputError) as info:
        registry.warm("p", C)
    assert info.value.field == "endpoint"
    for bad in (("ftp://x",), tuple(f"http://h{i}.test" for i in range(65))):
        with pytest.raises(InvalidInputError) as info:
            registry.register(PrefixSpec("q", SYSTEM, Target(A, "m"), endpoints=bad))
        assert info.value.field == "endpoints"


# ----- leases in a real Redis -------------------------------------------------------------------------------


def test_one_replica_holds_a_lease_until_it_stops_renewing(redis_client):
    first = RedisWarmGate(redis_client, budget_per_minute=10, lease_ttl_s=0.3, replica_id="r1")
    second = RedisWarmGate(redis_client, budget_per_minute=10, lease_ttl_s=0.3, replica_id="r2")
    assert first.holds("p", A) and not second.holds("p", A)
    assert second.holds("p", B) and not first.holds("p", B)  # leases are per (prefix, endpoint)
    assert redis_client.get(first.lease_key("p", A)) == b"r1"
    time.sleep(0.5)  # r1 stopped renewing: its lease is gone after the TTL
    assert second.holds("p", A) and not first.holds("p", A)


def test_the_warm_budget_is_shared_by_the_fleet(redis_client):
    gates = [RedisWarmGate(redis_client, budget_per_minute=3, replica_id=f"r{i}") for i in range(2)]
    spent = [gates[0].try_spend(), gates[1].try_spend(), gates[0].try_spend(), gates[1].try_spend()]
    assert spent == [True, True, True, False]


def test_two_replicas_send_one_schedule_of_warms_and_the_survivor_takes_over(fleet, clock, redis_client):
    def replica(name: str) -> PrefixRegistry:
        gate = RedisWarmGate(redis_client, budget_per_minute=100, lease_ttl_s=30, replica_id=name, clock=clock)
        return PrefixRegistry(RedisPrefixStore(redis_client), fleet.client(), CONFIG, clock=clock,
                              wall_clock=clock, gate=gate)

    first, second = replica("r1"), replica("r2")
    first.register(PrefixSpec("p", SYSTEM, Target(A, "m"), endpoints=(B,)))  # an admin call warms at once
    sent = []
    for _ in range(4):
        clock.now += 8
        sent += [("r1", w.endpoint) for w in first.tick()] + [("r2", w.endpoint) for w in second.tick()]
    assert sent == [("r1", A), ("r1", B)] * 2  # r1 warms on its schedule (8 s, then 12 s); r2 never
    assert len(fleet[A].prompts) == len(fleet[B].prompts) == 3

    redis_client.delete(*redis_client.keys("rc:prefixes:lease:*"))  # r1 died: its leases expired
    clock.now += 12
    assert {(w.endpoint, w.outcome) for w in second.tick()} == {(A, WarmOutcome.PRIME), (B, WarmOutcome.PRIME)}
    assert first.tick() == []  # r1 (come back) finds the leases held


def test_the_stats_route_shows_each_endpoint_and_the_client_warms_one(fleet, clock, tmp_path):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from ragcache.client import Client
    from ragcache_server.prefixes_api import router
    from tests.live_server import transport_to

    app = FastAPI()
    app.state.prefixes = registry_for(fleet, clock, tmp_path)
    app.include_router(router)
    with TestClient(app) as test_client:
        client = Client("http://ragcache.test", transport=transport_to(test_client))
        client.register_prefix("p", SYSTEM, Target(A, "m"), endpoints=(B,))
        fleet[B].evict_all()
        assert client.warm_prefix("p", endpoint=B).outcome is WarmOutcome.EVICTED
        stats = client.prefix_stats("p")
    assert [(e["base_url"], e["resident"], e["num_evicted"], e["num_warms"]) for e in stats["endpoints"]] == [
        (A, None, 0, 1), (B, False, 1, 2)]
    assert stats["num_warms"] == 3 and stats["endpoints"][1]["last_warm_at"] == clock.now


def test_metrics_show_residency_and_evictions_per_endpoint(fleet, clock, tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from ragcache.prefixes import register_prefix_metrics

    registry = registry_for(fleet, clock, tmp_path)
    registry.register(PrefixSpec("p", SYSTEM, Target(A, "m"), endpoints=(B,)))
    fleet[A].evict_all()
    clock.now += 8
    registry.tick()
    collectors = CollectorRegistry()
    register_prefix_metrics(registry, collectors)
    text = generate_latest(collectors).decode()
    assert f'ragcache_prefix_endpoint_resident{{endpoint="{A}",prefix="p"}} 0.0' in text
    assert f'ragcache_prefix_endpoint_resident{{endpoint="{B}",prefix="p"}} 1.0' in text
    assert f'ragcache_prefix_endpoint_evictions_total{{endpoint="{A}",prefix="p"}} 1.0' in text
    assert f'ragcache_prefix_endpoint_evictions_total{{endpoint="{B}",prefix="p"}} 0.0' in text
