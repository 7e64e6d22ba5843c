"""A warm budget per tenant (issue 27, item 8): one tenant's many prefixes spend its own share of the warm budget,
never another tenant's. Before, the budget was one for all: after 125 registrations of one tenant another tenant's
prefix was skipped. In one process (the local gate, behind a vLLM stand-in) and across the fleet (the Redis gate, on
the real Redis)."""

from __future__ import annotations

import dataclasses
import math

import httpx
import redis

from ragcache.prefixes import FilePrefixStore, PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, VLLMClient, WarmOutcome
from ragcache.prefixes.budget import sized_budget
from ragcache.prefixes.lease import RedisWarmGate, TenantBudgets
from tests.prefixes.test_prefixes_unit import FakeClock, FakeVLLM

SYSTEM = "You are a support assistant. Answer from the context only, and say so when it does not know.\n"
# No prefix here turns idle (idle_after_s): the tenants' shares are what these tests pin; the idle reserve has its own.
CONFIG = PrefixRegistryConfig(warm_budget_per_minute=10, warm_budget_per_tenant_per_minute=6, default_block_size=4,
                              store_refresh_interval_s=0.0, idle_after_s=1e9)


def registry_on(tmp_path, config: PrefixRegistryConfig = CONFIG) -> tuple[PrefixRegistry, FakeClock]:
    clock, vllm = FakeClock(), FakeVLLM()
    http = httpx.Client(transport=httpx.MockTransport(vllm.handler))
    registry = PrefixRegistry(FilePrefixStore(tmp_path / "prefixes.json"), VLLMClient(http), config, clock=clock,
                              wall_clock=clock)
    return registry, clock


def register(registry: PrefixRegistry, tenant: str, i: int) -> WarmOutcome:
    spec = PrefixSpec(f"p{i}", f"{SYSTEM}Prefix {i}.\n", Target("http://vllm.test", "m"))
    warm = registry.register(spec, tenant=tenant).warm
    assert warm is not None
    return warm.outcome


def test_one_tenants_registrations_never_skip_another_tenants_warm(tmp_path):
    registry, _ = registry_on(tmp_path)
    acme = [register(registry, "acme", i) for i in range(12)]  # more than the whole budget of 10
    assert acme == [WarmOutcome.PRIME] * 6 + [WarmOutcome.SKIPPED] * 6  # its own 6, then skipped
    assert register(registry, "globex", 0) is WarmOutcome.PRIME  # the budget acme could not spend is globex's
    assert registry.stats().num_warms_sent == 7


def test_acmes_skipped_warms_go_out_when_its_own_minute_allows_and_the_total_still_holds(tmp_path):
    registry, clock = registry_on(tmp_path)
    for i in range(12):
        register(registry, "acme", i)
    for tenant in ("globex", "initech"):
        for i in range(3):
            register(registry, tenant, i)
    # 6 (acme) + 3 (globex) + 1 (initech): the total of 10 is spent, so initech's 2 others wait as acme's 6 do.
    assert registry.stats().num_warms_sent == 10
    clock.now += 61  # a new minute: the loop sends the oldest waiting first, within both budgets
    sent = [r for r in registry.tick() if r.outcome is not WarmOutcome.SKIPPED]
    by_tenant = {tenant: sum(1 for r in sent if r.name.startswith(f"{tenant}--")) for tenant in ("acme", "globex", "initech")}
    assert sum(by_tenant.values()) == 10 and by_tenant["acme"] <= 6


def test_the_budgets_spend_together_or_not_at_all():
    clock = FakeClock()
    budgets = TenantBudgets(per_minute=3, per_tenant_per_minute=2, clock=clock)
    assert [budgets.try_spend("a") for _ in range(3)] == [True, True, False]  # a's own 2
    assert [budgets.try_spend("b") for _ in range(2)] == [True, False]  # the total's last one
    assert budgets.try_spend(None) is False
    clock.now += 60.5
    assert budgets.try_spend("b") and budgets.try_spend(None)


def test_the_fleets_budget_is_per_tenant_in_redis_too(redis_url):
    client = redis.Redis.from_url(redis_url)
    gates = [RedisWarmGate(client, budget_per_minute=5, budget_per_tenant_per_minute=3, replica_id=f"r{i}") for i in range(2)]
    acme = [gates[i % 2].try_spend("acme") for i in range(5)]  # two replicas, one log per tenant
    assert acme == [True, True, True, False, False]
    assert [gates[1].try_spend("globex"), gates[0].try_spend("globex"), gates[1].try_spend("globex")] == [True, True, False]
    assert client.zcard(gates[0].log_keys("acme")[1]) == 3 and client.zcard(gates[0].log_keys(None)[0]) == 5


def test_the_budget_follows_use_an_idle_prefix_leaves_room_for_one_in_use(tmp_path):
    """Issue 42, item 5: with all users on one prefix, the budget deferred 15-21 of its warms because idle pinned
    prefixes spent it. Now a prefix no request used for idle_after_s is warmed only while more than idle_budget_share
    of the minute's budget is left, after the prefixes in use, and says so in why_not_cached."""
    config = PrefixRegistryConfig(warm_budget_per_minute=100, warm_budget_per_tenant_per_minute=4, default_block_size=4,
                                  store_refresh_interval_s=0.0, idle_after_s=30.0, idle_budget_share=0.5,
                                  initial_rewarm_interval_s=5.0, min_rewarm_interval_s=2.0, max_rewarm_interval_s=5.0)
    registry, clock = registry_on(tmp_path, config)
    target = Target("http://vllm.test", "m")
    for name in ("used", "quiet"):
        assert registry.register(PrefixSpec(name, f"{SYSTEM}{name}.\n", target)).warm.outcome is WarmOutcome.PRIME
    clock.now += 31  # 2 of the tenant's 4 warms this minute left; both due; "quiet" idle for 31 s
    registry.record_use("used", 1)
    outcomes = {r.name: (r.outcome, r.error) for r in registry.tick()}
    assert outcomes == {"used": (WarmOutcome.RESIDENT, None),  # in use: warmed first, and may spend the budget's last
                        "quiet": (WarmOutcome.SKIPPED, "idle: kept warm only while the warm budget has room")}
    reasons = registry.prefix_stats("quiet").endpoints[0].why_not_cached
    assert reasons == ("no request used it for 31 s: an idle prefix is kept warm only while the warm budget has room "
                       "(1 of its warms waited for room)",)
    clock.now += 30  # a new minute: room again, and the idle prefix is warmed
    assert {r.name: r.outcome for r in registry.tick()}["quiet"] is WarmOutcome.RESIDENT
    assert registry.prefix_stats("quiet").endpoints[0].why_not_cached == ()


def test_the_budget_is_sized_from_the_engines_kv_cache_turnover():
    """Issue 42, item 5: one warm per turnover of the engine's KV cache per pinned (prefix, endpoint), plus one per
    pair not primed, twice over, within [floor, ceiling]; unknown figures give the ceiling (as when sizing is off)."""
    # The bench kv engine: 8,192 tokens of cache, 4,000 computed tokens/s: a turnover every 2.05 s.
    assert sized_budget([(8192 / 4000, True)], floor=12, ceiling=120) == 59
    assert sized_budget([(8192 / 4000, True)] * 3, floor=12, ceiling=120) == 120  # 176 needed: the ceiling
    assert sized_budget([(math.inf, True), (math.inf, False)], floor=12, ceiling=120) == 12  # quiet: the floor
    assert sized_budget([(10.0, False)], floor=1, ceiling=120) == 14  # (6 + the prime) x 2
    assert sized_budget([(10.0, True), (None, True)], floor=12, ceiling=120) == 120
    assert sized_budget([], floor=12, ceiling=120) == 12
    # With events: the warms that check them, one per verify_interval_s (10 s) per endpoint, are in the need too.
    assert sized_budget([(8192 / 4000, True)], floor=12, ceiling=120, checks_per_minute=6) == 71
    assert sized_budget([(math.inf, True)] * 2, floor=1, ceiling=120, checks_per_minute=12) == 24


def test_a_registry_sizes_its_budget_from_what_the_engines_metrics_report(tmp_path):
    config = PrefixRegistryConfig(warm_budget_per_minute=120, warm_budget_per_tenant_per_minute=120, default_block_size=4,
                                  store_refresh_interval_s=0.0, idle_after_s=1e9, metrics_interval_s=5.0,
                                  warm_budget_min_per_minute=4, warm_on_event=False, warm_budget_sized=True)
    clock, vllm = FakeClock(), FakeVLLM()
    vllm.num_gpu_blocks = 64  # 256 tokens of KV cache
    http = httpx.Client(transport=httpx.MockTransport(vllm.handler))
    registry = PrefixRegistry(FilePrefixStore(tmp_path / "prefixes.json"), VLLMClient(http), config, clock=clock,
                              wall_clock=clock)
    registry.register(PrefixSpec("p", f"{SYSTEM}Pinned.\n", Target("http://vllm.test", "m")))
    registry.tick()  # the first scrape: no rate yet
    assert registry.stats().warm_budget_per_minute == 120
    clock.now += 5
    vllm.queries += 256  # the engine computed 256 tokens in 5 s: its cache turns over every 5 s, 12 times a minute
    registry.tick()
    registry.tick()
    assert registry.stats().warm_budget_per_minute == 24
    for _ in range(30):
        registry.warm("p")
    assert registry.stats().num_warms_sent == 24  # this minute's, the prime and the ticks' included
    assert registry.warm("p").error == "warm budget for this minute (the fleet's or the tenant's) is spent"
    clock.now += 61  # the engine computed nothing since: nothing turns its cache over, the budget is the floor
    registry.tick()
    registry.tick()
    assert registry.stats().warm_budget_per_minute == 4
    off = PrefixRegistry(FilePrefixStore(tmp_path / "off.json"), VLLMClient(http),
                         dataclasses.replace(config, warm_budget_sized=False), clock=clock, wall_clock=clock)
    off.tick()
    assert off.stats().warm_budget_per_minute is None


def test_a_sized_budget_lowers_the_configured_one_in_both_gates(redis_url):
    budgets = TenantBudgets(per_minute=10, per_tenant_per_minute=10, clock=FakeClock())
    assert [budgets.try_spend(None, 0, per_minute=3) for _ in range(4)] == [True, True, True, False]
    assert budgets.try_spend(None) is True  # the configured 10 still has room
    gate = RedisWarmGate(redis.Redis.from_url(redis_url), budget_per_minute=10, key_prefix="rc:sized", replica_id="r")
    assert [gate.try_spend(None, 0, per_minute=2) for _ in range(3)] == [True, True, False]
    assert gate.try_spend(None, 0, per_minute=50) is True  # never above the configured 10
