"""Logic of the KV-prefix registry, with a fake vLLM behind ``httpx.MockTransport`` and a fake clock.

The real-vLLM behaviour (caching, eviction, restart) is tested in tests/vllm; here every rule is pinned
exactly: the adaptive interval, the budget, the back-off, volatile spans, rendering, storage, versions.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from ragcache.client import AsyncClient, Client
from ragcache.core.health import TierHealth
from ragcache.engines import parse_prefix_cache_counters
from ragcache.errors import InvalidInputError, NotFoundError, RagCacheError
from ragcache.prefixes import (
    FilePrefixStore,
    PrefixName,
    PrefixRegistry,
    PrefixRegistryConfig,
    PrefixSpec,
    PromptForm,
    Target,
    TargetUnavailableError,
    VLLMClient,
    WarmOutcome,
    assemble_prompt,
    check_name,
    find_volatile,
    make_store,
    register_prefix_metrics,
    render_messages,
    render_text,
    template_head,
)
from ragcache.prefixes.model import MAX_USES_PER_REPORT
from ragcache.prefixes.policy import Schedule, WarmBudget, holds_warm, judge_residency, next_schedule
from ragcache.retrieval.results import SearchHit
from ragcache_server.prefixes_api import router
from tests.live_server import transport_to

BLOCK = 4
TARGET = Target("http://vllm.test", "m")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeVLLM:
    """A vLLM stand-in: one token per word plus BOS, whole-block prefix caching, switchable outage."""

    def __init__(self) -> None:
        self.cached: set[str] = set()
        self.down = False
        self.prompts: list[str] = []
        self.queries = self.hits = 0
        self.pins: list[dict] = []
        self.bodies: list[dict] = []  # every completion request, as sent
        self.running: int | None = None  # /metrics gauges; None: not exposed
        self.waiting: int | None = None
        self.refuse_priority = False  # an older vLLM without priority scheduling
        self.num_scrapes = 0  # /metrics requests
        self.num_gpu_blocks: int | None = None  # the KV cache's size in vllm:cache_config_info; None: not exposed
        self.before_completion: Callable[[], None] | None = None  # runs as a completion arrives (the engine's moment)

    def evict_all(self) -> None:
        self.cached.clear()

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/metrics":
            self.num_scrapes += 1
            labels = f'block_size="{BLOCK}"' + ("" if self.num_gpu_blocks is None else
                                                f',num_gpu_blocks="{self.num_gpu_blocks}"')
            body = (f"# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total {self.queries}\n"
                    f"# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total {self.hits}\n"
                    f"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{labels}}} 1\n")
            for name, value in (("running", self.running), ("waiting", self.waiting)):
                if value is not None:
                    body += f'# TYPE vllm:num_requests_{name} gauge\nvllm:num_requests_{name}{{engine="0"}} {value}\n'
            return httpx.Response(200, text=body)
        data = json.loads(request.content)
        if request.url.path == "/pin":  # an LMCache controller on the same fake host
            self.pins.append(data)
            return httpx.Response(200, json={"event_id": "e1", "num_tokens": len(data["tokens"])})
        if "messages" in data:  # a chat: the model's template applied, as vLLM's /tokenize and chat completions do
            tokens = chat_tokens(data["messages"], data.get("add_generation_prompt", True))
            prompt = repr(data["messages"])
        else:
            tokens = list(range(len(data["prompt"].split()) + 1))
            prompt = data["prompt"]
        num_tokens = len(tokens)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"count": num_tokens, "tokens": tokens})
        if self.refuse_priority and data.get("priority", 0) != 0:
            return httpx.Response(400, json={"error": "Priority scheduling is not enabled."})
        if self.before_completion is not None:
            self.before_completion()
        self.bodies.append(data)
        self.prompts.append(prompt)
        cached = (num_tokens - 1) // BLOCK * BLOCK if prompt in self.cached else 0
        self.cached.add(prompt)
        self.queries += num_tokens
        self.hits += cached
        usage = {"prompt_tokens": num_tokens, "prompt_tokens_details": {"cached_tokens": cached}}
        return httpx.Response(200, json={"usage": usage})


def chat_tokens(messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    """The stand-in's chat template: BOS, then per message a role token, one token per word and an end token, then
    the assistant's role token (a word is its length plus 100, so two texts of the same shape share tokens)."""
    roles = {"system": 1, "user": 2, "assistant": 3}
    tokens = [0]
    for message in messages:
        tokens += [roles[message["role"]], *(100 + len(word) for word in message["content"].split()), 9]
    return tokens + [3] * add_generation_prompt


# No prefix turns idle here (idle_after_s): the schedule and the budget are what these tests pin; the idle reserve has
# its own test (test_prefix_warm_budget.py).
CONFIG = PrefixRegistryConfig(initial_rewarm_interval_s=8.0, min_rewarm_interval_s=2.0, max_rewarm_interval_s=16.0,
                              warm_budget_per_minute=100, backoff_min_s=1.0, backoff_max_s=4.0,
                              metrics_interval_s=5.0, store_refresh_interval_s=0.0, default_block_size=BLOCK,
                              idle_after_s=1e9)
SYSTEM = "You are a careful assistant who answers from the given context only and cites it."


@pytest.fixture
def vllm() -> FakeVLLM:
    return FakeVLLM()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_registry(vllm, clock, tmp_path, config=CONFIG) -> PrefixRegistry:
    http = httpx.Client(transport=httpx.MockTransport(vllm.handler))
    return PrefixRegistry(FilePrefixStore(tmp_path / "prefixes.json"), VLLMClient(http), config,
                          clock=clock, wall_clock=clock)


@pytest.fixture
def registry(vllm, clock, tmp_path) -> PrefixRegistry:
    return make_registry(vllm, clock, tmp_path)


# ----- policy ---------------------------------------------------------------------------------------


def test_interval_grows_while_resident_and_stays_below_a_gap_that_evicted():
    s = Schedule(8.0)
    s = next_schedule(s, WarmOutcome.RESIDENT, 8.0, CONFIG)
    assert s == Schedule(12.0)
    s = next_schedule(s, WarmOutcome.RESIDENT, 12.0, CONFIG)
    assert s == Schedule(16.0)  # the configured ceiling
    s = next_schedule(s, WarmOutcome.EVICTED, 15.0, CONFIG)  # evicted within a 15 s gap
    assert s == Schedule(7.5, 15.0)
    s = next_schedule(s, WarmOutcome.RESIDENT, 7.5, CONFIG)
    assert s == Schedule(7.65, 15.3)  # grows only to half the (slowly relaxing) evicting gap
    s = next_schedule(s, WarmOutcome.EVICTED, 3.0, CONFIG)
    assert s == Schedule(2.0, 3.0)  # 1.5 s would be under the 2 s floor
    for outcome in (WarmOutcome.PRIME, WarmOutcome.ERROR, WarmOutcome.SKIPPED):
        assert next_schedule(s, outcome, 100.0, CONFIG) == s


def test_residency_needs_every_full_block_of_the_prompt():
    # 100 tokens in blocks of 32: blocks 0-2 (96 tokens) are cacheable, the last token never is.
    assert judge_residency(100, 96, 32)
    assert not judge_residency(100, 64, 32)
    assert judge_residency(97, 96, 32) and not judge_residency(98, 64, 32)
    assert judge_residency(20, 0, 32)  # shorter than a block: nothing to cache


def test_budget_is_a_sliding_minute(clock):
    budget = WarmBudget(3, clock)
    assert [budget.try_acquire() for _ in range(4)] == [True, True, True, False]
    clock.now += 59.9
    assert not budget.try_acquire()
    clock.now += 0.1  # the first three leave the window together
    assert budget.num_available == 3


def test_a_targets_breaker_doubles_its_back_off_up_to_the_cap_and_resets():
    clock = FakeClock()
    health = TierHealth(backoff_initial_s=CONFIG.backoff_min_s, backoff_max_s=CONFIG.backoff_max_s, clock=clock)
    delays = []
    for _ in range(4):
        health.record_failure(TargetUnavailableError("http://vllm:8000", "refused"))
        delays.append(health.retry_at - clock.now)
    assert delays == [1.0, 2.0, 4.0, 4.0]
    clock.now += 3.9
    assert health.is_down and not health.may_try() and not health.may_try()  # a peek claims nothing
    clock.now += 0.1
    assert health.may_try()
    assert health.record_success() is True and not health.is_down and health.record_success() is False


# ----- text -----------------------------------------------------------------------------------------


def test_volatile_content_is_found_and_named():
    text = ("Today is 2024-05-01T10:15:00Z. Request id: 7f3a. Trace 123e4567-e89b-12d3-a456-426614174000 "
            "on 3 March 2025 at 10:15:33, ts 1714558500.")
    spans = find_volatile(text)
    assert [(s.kind, s.text) for s in spans] == [
        ("timestamp", "2024-05-01T10:15:00Z"),
        ("request id", "Request id: 7f3a"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000"),
        ("date", "3 March 2025"),
        ("time", "10:15:33"),
        ("unix timestamp", "1714558500"),
    ]
    assert text[spans[2].start:spans[2].end] == spans[2].text
    assert "uuid '123e4567" in spans[2].message()
    assert find_volatile(SYSTEM + " Answer in 3 sentences, version 2.1.") == ()


def test_template_head_is_the_text_before_the_first_slot_with_braces_unescaped():
    assert template_head("Use JSON {{like this}}.\nContext: {ctx}\nQ: {q}", True) == "Use JSON {like this}.\nContext: "
    assert template_head("Plain {braces} kept", False) == "Plain {braces} kept"


def test_registry_render_and_messages_count_a_use_and_read_the_store_once(registry, monkeypatch):
    registry.register(PrefixSpec("qa", "Sys. {question}", TARGET, is_template=True), tenant="acme")
    qa = PrefixName.of("qa", "acme")
    store = registry._known.store
    reads = []
    store_get = store.get
    monkeypatch.setattr(store, "get", lambda name: reads.append(name) or store_get(name))
    assert registry.render(qa, question="Q?") == "Sys. Q?"
    assert registry.messages(qa, "hi", question="Q?")[0] == {"role": "system", "content": "Sys. Q?"}
    assert reads == ["acme--qa", "acme--qa"]
    assert registry.prefix_stats(qa).num_uses == 2


def test_render_puts_the_prefix_first_byte_for_byte(registry):
    tmpl = "Sys: be exact {{json}}.\nContext: {context}\nQuestion: {question}\n"
    prefix = registry.register(PrefixSpec("t", tmpl, TARGET, is_template=True)).prefix
    head = template_head(tmpl, True)
    for slots in ({"context": "a", "question": "b"}, {"context": "{x}", "question": "ünï"}):
        out = render_text(prefix, slots)
        assert out.encode()[: len(head.encode())] == head.encode()
    expected = "Sys: be exact {json}.\nContext: C\nQuestion: Q?\n"
    assert render_text(prefix, {"context": "C", "question": "Q?"}) == expected
    with pytest.raises(InvalidInputError, match="question"):
        render_text(prefix, {"context": "C"})
    system = registry.register(PrefixSpec("s", "Raw {not a slot}", TARGET)).prefix
    assert render_messages(system, "hi", {}) == [{"role": "system", "content": "Raw {not a slot}"},
                                                {"role": "user", "content": "hi"}]
    assert render_text(system, {"suffix": "\nUser: x"}) == "Raw {not a slot}\nUser: x"
    with pytest.raises(InvalidInputError):
        render_text(system, {"context": "x"})


# ----- store ----------------------------------------------------------------------------------------


def test_file_store_persists_across_instances_and_is_the_fallback(registry, tmp_path):
    registry.register(PrefixSpec("b", SYSTEM, TARGET))
    registry.register(PrefixSpec("a", SYSTEM + " Be brief.", TARGET, pinned=False))
    store = make_store(None, tmp_path / "prefixes.json")
    assert isinstance(store, FilePrefixStore)
    assert [(p.name, p.pinned, p.target) for p in store.list()] == [("a", False, TARGET), ("b", True, TARGET)]
    assert store.get("a") == registry.get("a")
    assert store.delete("a") and not store.delete("a") and store.get("a") is None


# ----- registry -------------------------------------------------------------------------------------


def test_changing_the_text_makes_a_new_version_and_only_it_is_warmed(registry, vllm, clock):
    first = registry.register(PrefixSpec("p", SYSTEM, TARGET))
    assert (first.created, first.new_version, first.prefix.version, first.prefix.num_tokens) == (True, True, 1, 16)
    same = registry.register(PrefixSpec("p", SYSTEM, TARGET))
    assert (same.created, same.new_version, same.prefix.version, same.warm) == (False, False, 1, None)
    second = registry.register(PrefixSpec("p", SYSTEM + " Be brief.", TARGET))
    assert (second.new_version, second.prefix.version, second.prefix.created_at) == (True, 2, first.prefix.created_at)
    vllm.prompts.clear()
    clock.now += 100
    registry.tick()
    assert vllm.prompts == [SYSTEM + " Be brief."]
    assert registry.prefix_stats("p").version == 2


def test_warm_outcomes_drive_the_interval(registry, vllm, clock):
    assert registry.register(PrefixSpec("p", SYSTEM, TARGET)).warm.outcome is WarmOutcome.PRIME
    registry.scrape(TARGET.base_url)  # learns the block size
    outcomes, intervals = [], []
    for evict in (False, False, True, False):
        if evict:
            vllm.evict_all()
        clock.now += registry.prefix_stats("p").rewarm_interval_s
        (result,) = registry.tick()
        outcomes.append(result.outcome)
        intervals.append(registry.prefix_stats("p").rewarm_interval_s)
    assert outcomes == [WarmOutcome.RESIDENT, WarmOutcome.RESIDENT, WarmOutcome.EVICTED, WarmOutcome.RESIDENT]
    # Evicted within a 16 s gap: from then on the interval stays near half of it (16 x 1.02 / 2).
    assert intervals == [12.0, 16.0, 8.0, 8.16]
    stats = registry.prefix_stats("p")
    assert (stats.num_warms, stats.num_resident, stats.num_evicted, stats.residency_rate) == (5, 3, 1, 0.75)
    assert registry.tick() == []  # not due yet


def test_budget_caps_warms_per_minute(vllm, clock, tmp_path):
    config = PrefixRegistryConfig(**{**CONFIG.__dict__, "warm_budget_per_minute": 2})
    registry = make_registry(vllm, clock, tmp_path, config)
    results = [registry.register(PrefixSpec(f"p{i}", f"{SYSTEM} {i}", TARGET)).warm.outcome for i in range(3)]
    assert results == [WarmOutcome.PRIME, WarmOutcome.PRIME, WarmOutcome.SKIPPED]
    assert len(vllm.prompts) == 2
    clock.now += 30  # all three are due, but this minute's budget is spent
    assert [r.outcome for r in registry.tick()] == [WarmOutcome.SKIPPED] * 3
    assert len(vllm.prompts) == 2 and registry.stats().num_warms_deferred == 4
    clock.now += 31  # the window has moved on; the longest-waiting prefix (the unprimed p2) goes first
    sent = [(r.name, r.outcome) for r in registry.tick() if r.outcome is not WarmOutcome.SKIPPED]
    assert sent == [("p2", WarmOutcome.PRIME), ("p0", WarmOutcome.RESIDENT)]


@pytest.mark.parametrize(("running", "waiting", "overdue_s", "limits", "held"), [
    (5, 0, 0.0, (0, None), False),  # users running, none waiting: the default lets the warm ride along
    (5, 1, 0.0, (0, None), True),  # users queue: held
    (5, 1, 5.0, (0, None), False),  # held long enough (warm_max_defer_s 5): it goes anyway
    (1, 0, 0.0, (0, 0), True),  # strict idle: anything running holds it
    (0, 0, 0.0, (0, 0), False),
    (None, None, 0.0, (0, 0), False),  # a server that does not show its load holds nothing
    (9, 9, 0.0, (None, None), False),  # the gate is off
])
def test_a_due_warm_is_held_only_on_evidence_of_users_and_not_past_max_defer(running, waiting, overdue_s, limits,
                                                                             held):
    config = PrefixRegistryConfig(warm_max_waiting=limits[0], warm_max_running=limits[1], warm_max_defer_s=5.0)
    assert holds_warm(running, waiting, overdue_s, config) is held


def test_vllm_load_gauges_are_summed_over_engines():
    text = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 2\n'
            'vllm:num_requests_running{engine="1"} 1\n# TYPE vllm:num_requests_waiting gauge\n'
            'vllm:num_requests_waiting{engine="0"} 4\n')
    counters = parse_prefix_cache_counters(text)
    assert (counters.num_running, counters.num_waiting) == (3.0, 4.0)
    assert parse_prefix_cache_counters("").num_running is None


def test_warms_carry_the_lowest_priority_and_go_without_it_where_refused(registry, vllm, clock):
    registry.register(PrefixSpec("p", SYSTEM, TARGET))
    assert vllm.bodies[-1]["priority"] == registry.config.warm_priority == 1_000_000
    vllm.refuse_priority = True
    assert registry.warm("p").outcome is WarmOutcome.RESIDENT  # retried at once without the field
    assert "priority" not in vllm.bodies[-1] and len(vllm.bodies) == 2  # the refused one never arrived
    registry.warm("p")
    assert "priority" not in vllm.bodies[-1] and len(vllm.bodies) == 3  # not offered again
    assert registry.prefix_stats("p").num_errors == 0


def test_no_priority_field_when_the_setting_is_none(vllm, clock, tmp_path):
    registry = make_registry(vllm, clock, tmp_path, PrefixRegistryConfig(**{**CONFIG.__dict__, "warm_priority": None}))
    registry.register(PrefixSpec("p", SYSTEM, TARGET))
    assert "priority" not in vllm.bodies[-1]


def test_the_loop_holds_a_due_warm_while_users_wait_once_counted_then_sends_it(registry, vllm, clock):
    registry.register(PrefixSpec("p", SYSTEM, TARGET))
    vllm.running, vllm.waiting = 3, 2
    clock.now += registry.prefix_stats("p").rewarm_interval_s
    assert registry.tick() == [] and registry.tick() == []  # due, and users are queueing
    assert registry.stats().num_warms_held_busy == 1 and len(vllm.prompts) == 1
    assert vllm.num_scrapes == 2  # one per tick: a tick that scraped the endpoint as due reads its load from that
    vllm.waiting = 0  # the queue drained; users still running do not hold it by default
    assert [r.outcome for r in registry.tick()] == [WarmOutcome.RESIDENT]
    vllm.waiting = 2
    clock.now += registry.prefix_stats("p").rewarm_interval_s
    assert registry.tick() == []
    clock.now += registry.config.warm_max_defer_s  # held long enough: it goes although users still wait
    assert [r.outcome for r in registry.tick()] == [WarmOutcome.RESIDENT]
    assert registry.stats().num_warms_held_busy == 2


def test_registration_warms_at_once_even_while_users_wait(registry, vllm):
    vllm.waiting = 5  # registering is an explicit request: its prime is not held
    assert registry.register(PrefixSpec("p", SYSTEM, TARGET)).warm.outcome is WarmOutcome.PRIME


def test_vllm_down_keeps_entries_backs_off_and_reprimes_on_recovery(registry, vllm, clock):
    registry.register(PrefixSpec("p", SYSTEM, TARGET))
    vllm.down = True
    vllm.evict_all()  # a restart loses the KV cache
    clock.now += 100
    assert registry.tick() == []  # the scrape finds it down first, so no warm is even tried
    (target,) = registry.stats().targets
    assert not target.up and target.num_failures == 1
    down = registry.register(PrefixSpec("q", SYSTEM + " Q.", TARGET))  # registration still succeeds
    assert down.prefix.num_tokens is None and down.warm.outcome is WarmOutcome.SKIPPED
    clock.now += 0.5
    assert registry.tick() == []  # backing off: nothing is sent
    vllm.down = False
    clock.now += 5
    registry.tick()
    (target,) = registry.stats().targets
    assert target.up and target.num_failures == 0
    assert registry.prefix_stats("p").last_outcome is WarmOutcome.PRIME  # re-primed, not judged "evicted"
    assert registry.prefix_stats("q").last_outcome is WarmOutcome.PRIME
    assert registry.get("q").num_tokens == 17  # filled in from the warm's usage
    assert [p.name for p in registry.list()] == ["p", "q"]


def test_lmcache_controller_pins_the_prefix_tokens_once_per_prime(registry, vllm, clock):
    registry.register(PrefixSpec("p", SYSTEM, TARGET, lmcache_controller_url="http://vllm.test/"))
    registry.warm("p")  # a re-warm does not pin again
    assert vllm.pins == [{"tokens": list(range(16)), "instance_id": "lmcache_default_instance",
                          "location": "LocalCPUBackend"}]
    assert registry.prefix_stats("p").lmcache_pinned_tokens == 16


def test_register_warns_about_volatile_spans_and_sub_block_prefixes(registry):
    result = registry.register(PrefixSpec("v", "Date: 2025-01-31. Answer.", TARGET))
    assert result.warnings[0] == "volatile date '2025-01-31' at characters 6-16"
    assert "not more than one KV block" in result.warnings[1]
    tmpl = registry.register(PrefixSpec("t", SYSTEM + " {question} at 2025-01-31", TARGET, is_template=True))
    assert tmpl.warnings == ()  # only the constant head is shared, so only it is checked


@pytest.mark.parametrize("spec, field", [
    (PrefixSpec("bad name", SYSTEM, TARGET), "name"),
    (PrefixSpec("trailing-newline\n", SYSTEM, TARGET), "name"),
    (PrefixSpec("..", SYSTEM, TARGET), "name"),
    (PrefixSpec("p", SYSTEM, Target("vllm:8000", "m")), "target.base_url"),
    (PrefixSpec("p", "{slot} first", TARGET, is_template=True), "text"),
    (PrefixSpec("p", "unbalanced {", TARGET, is_template=True), "text"),
])
def test_invalid_specs_are_refused_with_the_field(registry, spec, field):
    with pytest.raises(InvalidInputError) as info:
        registry.register(spec)
    assert info.value.field == field


def test_unknown_names_raise_not_found(registry):
    for call in (registry.get, registry.delete, registry.warm, registry.prefix_stats):
        with pytest.raises(NotFoundError):
            call("nope")


def test_a_tenants_prefix_is_stored_under_its_tenant_and_named_as_the_tenant_does(registry, vllm):
    """A ``PrefixName`` through the registry: every answer and every error carries the public name, never the
    stored ``acme--system`` nor another tenant's."""
    system = PrefixName.of("system", "acme")
    assert (system.stored, system.public) == ("acme--system", "system")
    registered = registry.register(PrefixSpec("system", SYSTEM, TARGET), tenant="acme")
    assert registered.prefix.name == "system" and [warm.name for warm in registered.warms] == ["system"]
    template = registry.register(PrefixSpec("qa", SYSTEM + " {question}", TARGET, is_template=True), tenant="acme")
    assert [prefix.name for prefix in registry.list()] == ["acme--qa", "acme--system"]  # the store's (operator's) view
    assert registry.get(system).name == "system" and registry.get(system).text == SYSTEM
    assert registry.warm(system).name == "system"
    registry.record_use(system, 3)
    stats = registry.prefix_stats(system)
    assert (stats.name, stats.num_uses) == ("system", 3)
    assert [item.name for item in registry.stats().prefixes] == ["acme--qa", "acme--system"]
    assert template.prefix.name == "qa"
    errors = []
    for call in (
        lambda: registry.get(PrefixName.of("system", "globex")),  # another tenant's same name: not there
        lambda: registry.get(PrefixName.of("globex--system", "acme")),
        lambda: registry.delete(PrefixName.of("nope", "acme")),
        lambda: registry.record_use(PrefixName.of("nope", "acme")),
        lambda: registry.prefix_stats(PrefixName.of("nope", "acme")),
        lambda: registry.warm(PrefixName.of("nope", "acme")),
        lambda: registry.warm(system, "http://elsewhere.test"),
        lambda: registry.render(PrefixName.of("qa", "acme")),
        lambda: registry.render(system, question="?"),
        lambda: registry.register(PrefixSpec("s" * 124, SYSTEM, TARGET), tenant="acme"),
    ):
        with pytest.raises((NotFoundError, InvalidInputError)) as caught:
            call()
        errors.append(str(caught.value))
    assert "'system'" in errors[0] and "'globex--system'" in errors[1] and "'nope'" in errors[2]
    assert "'system' is not served by" in errors[6] and "'qa' needs slots" in errors[7]
    assert "'system' has no slots" in errors[8] and "at most 122 characters" in errors[9]
    assert all("acme--" not in error for error in errors), errors
    registry.delete(system)
    assert [prefix.name for prefix in registry.list()] == ["acme--qa"]


def test_vllm_client_converts_every_failure():
    def handler(request):
        if request.url.path == "/v1/completions":
            return httpx.Response(500, text="boom")
        if request.url.path == "/tokenize":
            return httpx.Response(200, text="not json")
        raise httpx.ReadTimeout("slow", request=request)

    client = VLLMClient(httpx.Client(transport=httpx.MockTransport(handler)))
    calls = (lambda: client.complete_one(TARGET, "x", PromptForm.COMPLETION),
             lambda: client.count_tokens(TARGET, "x"),
             lambda: client.prefix_cache_counters(TARGET.base_url))
    for call in calls:
        with pytest.raises(TargetUnavailableError) as info:
            call()
        assert isinstance(info.value, RagCacheError) and info.value.__cause__ is not None


def test_metrics_collector_exposes_prefix_and_target_series(registry, vllm, clock):
    registry.register(PrefixSpec("p", SYSTEM, TARGET))
    registry.scrape(TARGET.base_url)
    registry.warm("p")
    registry.scrape(TARGET.base_url)
    collectors = CollectorRegistry()
    register_prefix_metrics(registry, collectors)
    text = generate_latest(collectors).decode()
    assert 'ragcache_prefix_tokens{prefix="p"} 16.0' in text
    assert 'ragcache_prefix_warms_total{outcome="resident",prefix="p"} 1.0' in text
    assert 'ragcache_prefix_residency_ratio{prefix="p"} 1.0' in text
    assert 'ragcache_vllm_target_up{target="http://vllm.test"} 1.0' in text
    assert 'ragcache_vllm_prefix_cache_hit_ratio{target="http://vllm.test"} 0.375' in text  # 12 / 32


# ----- HTTP routes and client -----------------------------------------------------------------------


@pytest.fixture
def service(registry):
    app = FastAPI()
    app.state.prefixes = registry
    app.include_router(router)

    @app.exception_handler(NotFoundError)
    def not_found(request, exc):
        from fastapi.responses import JSONResponse

        return JSONResponse({"error": {"message": str(exc)}}, status_code=404)

    with TestClient(app) as client:
        yield client


def test_routes_register_list_warm_stats_delete(service):
    body = {"name": "rag", "text": SYSTEM + "\nContext: {context}\n", "is_template": True,
            "target": {"base_url": TARGET.base_url, "model": TARGET.model}}
    created = service.post("/prefixes", json=body)
    assert created.status_code == 201
    assert created.json()["prefix"]["text"] == body["text"] and created.json()["prefix"]["version"] == 1
    assert created.json()["warm"]["outcome"] == "prime"
    assert service.post("/prefixes", json=body).status_code == 200
    assert [p["name"] for p in service.get("/prefixes").json()] == ["rag"]
    assert service.post("/prefixes/rag/warm").json()["outcome"] in ("resident", "evicted")
    assert service.get("/prefixes/rag/stats").json()["num_warms"] == 2
    assert service.delete("/prefixes/rag").status_code == 204
    assert service.get("/prefixes/rag").status_code == 404


async def test_async_client_has_the_same_operations(registry):
    app = FastAPI()
    app.state.prefixes = registry
    app.include_router(router)
    async with AsyncClient("http://ragcache.test", transport=httpx.ASGITransport(app=app)) as client:
        answer = await client.register_prefix("a", SYSTEM + " {q}", TARGET, is_template=True)
        assert (answer.created, answer.prefix.version, answer.warm.outcome) == (True, 1, WarmOutcome.PRIME)
        assert await client.render("a", q="why?") == SYSTEM + " why?"
        assert (await client.get_prefix("a")).num_tokens == 16
        await client.flush_uses()
        assert (await client.prefix_stats("a"))["num_uses"] == 1


def test_client_renders_locally_and_reports_uses_in_batches(service, clock):
    client = Client("http://ragcache.test", transport=transport_to(service), prefix_refresh_s=10, clock=clock)
    client.register_prefix("rag", SYSTEM + "\nContext: {context}\n", TARGET, is_template=True)
    prompts = [client.render("rag", context=str(i)) for i in range(3)]
    assert prompts[2] == SYSTEM + "\nContext: 2\n"
    assert client.messages("rag", "hi", context="c")[0]["content"].startswith(SYSTEM)
    assert client.prefix_stats("rag")["num_uses"] == 0  # not reported yet
    client.flush_uses()
    assert client.prefix_stats("rag")["num_uses"] == 4
    assert [p.name for p in client.list_prefixes()] == ["rag"]
    assert client.warm_prefix("rag").outcome is WarmOutcome.RESIDENT
    client.delete_prefix("rag")
    with pytest.raises(NotFoundError):
        client.get_prefix("rag")


def test_client_reports_more_uses_than_one_report_takes_in_several(service, clock):
    client = Client("http://ragcache.test", transport=transport_to(service), prefix_refresh_s=10, clock=clock)
    client.register_prefix("rag", SYSTEM, TARGET)
    for _ in range(MAX_USES_PER_REPORT + 1):
        client.render("rag")
    client.flush_uses()  # one report of 100,001 would be refused (422)
    assert client.prefix_stats("rag")["num_uses"] == MAX_USES_PER_REPORT + 1
    with pytest.raises(InvalidInputError, match=str(MAX_USES_PER_REPORT)) as refused:
        client.report_uses("rag", MAX_USES_PER_REPORT + 1)
    assert refused.value.field == "count"


@pytest.mark.parametrize("name", ["x/../../stats?", "..", "a b", "ok\n", "x%2F..", ""])
def test_client_refuses_a_name_that_would_leave_its_path_and_sends_nothing(name):
    sent: list[httpx.Request] = []
    client = Client("http://ragcache.test", transport=httpx.MockTransport(lambda r: sent.append(r) or
                                                                          httpx.Response(200, json={})))
    for call in (client.get_prefix, client.delete_prefix, client.warm_prefix, client.prefix_stats):
        with pytest.raises(InvalidInputError) as info:
            call(name)
        assert info.value.field == "name"
    assert sent == []


def test_client_sends_a_valid_name_as_one_path_segment():
    sent: list[httpx.Request] = []
    client = Client("http://ragcache.test/base", api_key="k",
                    transport=httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(200, json={})))
    client.prefix_stats("Rag-v1.2_x")
    assert sent[0].url.raw_path == b"/base/prefixes/Rag-v1.2_x/stats"
    assert sent[0].headers["authorization"] == "Bearer k"


def test_name_check_is_a_full_match():
    assert check_name("a" * 128) == "a" * 128
    for bad in ("a" * 129, "rag\n", "rag\r", "-rag", "rag/x"):
        with pytest.raises(InvalidInputError):
            check_name(bad)


def hit(doc_id: str, score: float) -> SearchHit:
    return SearchHit(doc_id, score, f"text of {doc_id}", {})


def test_assembled_prompt_orders_chunks_by_id_and_puts_volatile_content_last():
    first = assemble_prompt("SYS\n", [hit("d3", 0.9), hit("d1", 0.8), hit("d2", 0.1)], "Q: why? (12:00)\n")
    again = assemble_prompt("SYS\n", [hit("d2", 0.7), hit("d3", 0.6), hit("d1", 0.5), hit("d3", 0.4)], "Q: how?\n")
    assert first == "SYS\n[d1] text of d1\n[d2] text of d2\n[d3] text of d3\nQ: why? (12:00)\n"
    # The same chunks in another score order, one of them twice: the same bytes up to the question.
    shared = first[:first.index("Q:")]
    assert again == shared + "Q: how?\n"


def test_client_render_assembles_chunks_after_the_prefix(service, clock):
    client = Client("http://ragcache.test", transport=transport_to(service), clock=clock)
    client.register_prefix("sys", SYSTEM, TARGET)
    prompt = client.render("sys", chunks=[hit("b", 0.9), hit("a", 0.2)], volatile="Q?")
    assert prompt == SYSTEM + "[a] text of a\n[b] text of b\nQ?"
    messages = client.messages("sys", "Q?", chunks=[hit("b", 0.9)])
    assert messages == [{"role": "system", "content": SYSTEM + "[b] text of b\n"}, {"role": "user", "content": "Q?"}]
