"""Each vLLM endpoint on its own (issue 42, items 3 and 4): a replica that hangs holds only its own thread, and an
eviction the events show is warmed at once, not at the loop's next tick. A vLLM stand-in per host (httpx.MockTransport;
the frozen one answers nothing until released, as a SIGSTOPped server whose socket still accepts); a loopback ZMQ
publisher of the tests' own sends the events."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from ragcache.prefixes import EventsConfig, FilePrefixStore, PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target, VLLMClient
from tests.prefixes.kv_publisher import KVPublisher, removed, stored
from tests.prefixes.test_kv_events import wait_until
from tests.prefixes.test_prefixes_unit import BLOCK, FakeClock, FakeVLLM

A = Target("http://vllm-a.test", "m")
B = "http://vllm-b.test"
SYSTEM = "You answer from the context only and say so when the context is silent.\n"  # 13 tokens: 3 blocks of 4


class Fleet:
    """Two stand-ins by host; ``b`` can be frozen: its calls wait until it is thawed."""

    def __init__(self) -> None:
        self.a, self.b = FakeVLLM(), FakeVLLM()
        self.thawed = threading.Event()
        self.thawed.set()
        self.num_frozen_calls = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "vllm-b.test":
            if not self.thawed.is_set():
                self.num_frozen_calls += 1
                self.thawed.wait(60)
            return self.b.handler(request)
        return self.a.handler(request)


@pytest.fixture
def publisher() -> Iterator[KVPublisher]:
    publisher = KVPublisher().start()
    yield publisher
    publisher.close()


def started(fleet: Fleet, publisher: KVPublisher, tmp_path, **config) -> PrefixRegistry:
    config = PrefixRegistryConfig(default_block_size=BLOCK, store_refresh_interval_s=0.0, metrics_interval_s=5.0,
                                  initial_rewarm_interval_s=8.0, min_rewarm_interval_s=2.0, max_rewarm_interval_s=16.0,
                                  kv_events={A.base_url: EventsConfig(publisher.endpoint, publisher.replay_endpoint)},
                                  **config)
    http = httpx.Client(transport=httpx.MockTransport(fleet.handler))
    clock = FakeClock()
    registry = PrefixRegistry(FilePrefixStore(tmp_path / "p.json"), VLLMClient(http), config, clock=clock, wall_clock=clock)
    registry.register(PrefixSpec("sys", SYSTEM, A, endpoints=(B,)))  # primed on both
    registry.start()
    subscriber = registry._keep_warm.engines.subscriber(A.base_url)
    assert subscriber is not None and wait_until(lambda: subscriber.synced)
    publisher.publish([stored([10, 11, 12], None, list(range(12)), BLOCK)])  # what A stored for the prime
    registry.tick()  # learns the prefix's token ids on A
    assert wait_until(lambda: registry.view("sys").residency[0].resident_blocks == 3)
    return registry


def test_an_eviction_is_warmed_on_the_event_not_at_the_next_tick(publisher, tmp_path):
    fleet = Fleet()
    registry = started(fleet, publisher, tmp_path, tick_interval_s=3600.0)  # the loop's own tick never comes
    try:
        sent = len(fleet.a.prompts)
        publisher.publish([removed([12])])  # the prefix's last block evicted on A
        assert wait_until(lambda: len(fleet.a.prompts) > sent), "no warm until the next tick"
        assert len(fleet.b.prompts) == 1  # B (no eviction there) only had its prime
    finally:
        registry.close()


def test_a_frozen_replica_never_holds_the_other_ones_warms(publisher, tmp_path):
    fleet = Fleet()
    registry = started(fleet, publisher, tmp_path, tick_interval_s=0.05)
    try:
        registry._clock.now += 9  # both timers due, B's /metrics due: B's thread calls B, and hangs there
        fleet.thawed.clear()
        assert wait_until(lambda: fleet.num_frozen_calls > 0)
        sent = len(fleet.a.prompts)
        publisher.publish([removed([11, 12])])
        assert wait_until(lambda: len(fleet.a.prompts) > sent, timeout_s=20), "A's re-warm waited for B"
        assert not fleet.thawed.is_set()  # warmed while B was still frozen
    finally:
        fleet.thawed.set()
        registry.close()
