"""The KV-event subscriber against a loopback ZMQ publisher of the tests' own (tests/prefixes/kv_publisher.py, vLLM's
wire format): events drive residency exactly; a lost message is replayed; a publisher that dies, floods or sends
garbage costs a breaker and a log line, never the subscriber. The real vLLM's events: tests/vllm."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import pytest

from ragcache.engines import (
    BlockIndex,
    BlockRemoved,
    BlockStored,
    EventsConfig,
    KVEventsError,
    KVEventSubscriber,
    MsgpackError,
    decode_batch,
    prefix_digests,
    unpackb,
)
from tests.prefixes.kv_publisher import KVPublisher, packb, removed, stored

BLOCK = 4
PREFIX = list(range(1, 14))  # 13 tokens: 3 full blocks of 4


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Poll ``condition`` (a correctness wait, not a speed assertion: the deadline is far beyond any run)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def store_prefix(publisher: KVPublisher, first_hash: int = 100, *, skip_wire: bool = False) -> None:
    publisher.publish([stored([first_hash, first_hash + 1, first_hash + 2], None, PREFIX[:12], BLOCK)], skip_wire=skip_wire)


@pytest.fixture
def publisher() -> Iterator[KVPublisher]:
    publisher = KVPublisher().start()
    yield publisher
    publisher.close()


def subscriber_of(publisher: KVPublisher, changes: list[str] | None = None, **config) -> KVEventSubscriber:
    config = {"backoff_min_s": 0.05, "backoff_max_s": 0.2, **config}
    on_change = changes.append if changes is not None else None
    subscriber = KVEventSubscriber("http://vllm.test", EventsConfig(publisher.endpoint, publisher.replay_endpoint, **config),
                                   on_change=on_change)
    subscriber.start()
    assert wait_until(lambda: subscriber.synced), "the subscriber never synced"
    return subscriber


def resident(subscriber: KVEventSubscriber) -> int:
    return subscriber.index.resident_blocks(prefix_digests(PREFIX, BLOCK))


def test_the_index_counts_a_prefixs_leading_blocks_exactly():
    index = BlockIndex()
    digests = prefix_digests(PREFIX, BLOCK)
    assert len(digests) == 3 and index.resident_blocks(digests) == 0
    index.apply(BlockStored((1, 2), None, tuple(PREFIX[:8]), BLOCK))
    index.apply(BlockStored((3,), 2, tuple(PREFIX[8:12]), BLOCK))
    assert index.resident_blocks(digests) == 3
    index.apply(BlockStored((9,), 2, (0, 0, 0, 0), BLOCK))  # another prompt sharing two blocks: not the prefix's third
    index.apply(BlockRemoved((2,)))
    assert index.resident_blocks(digests) == 1  # the chain breaks at its second block
    index.apply(BlockStored((7,), 55, tuple(PREFIX[4:8]), BLOCK))  # a parent never seen: not placed, not counted
    assert index.num_unplaced == 1 and index.resident_blocks(digests) == 1


def test_events_drive_residency_and_report_each_removal(publisher):
    changes: list[str] = []
    subscriber = subscriber_of(publisher, changes)
    try:
        store_prefix(publisher)
        assert wait_until(lambda: resident(subscriber) == 3)
        publisher.publish([removed([101])])
        assert wait_until(lambda: resident(subscriber) == 1) and changes == ["http://vllm.test"]
        publisher.publish([{"type": "AllBlocksCleared"}])
        assert wait_until(lambda: resident(subscriber) == 0) and subscriber.index.num_blocks == 0
    finally:
        subscriber.stop()


def test_a_lost_message_is_replayed(publisher):
    subscriber = subscriber_of(publisher)
    try:
        store_prefix(publisher, skip_wire=True)  # buffered by the publisher, never received live
        publisher.publish([stored([200], 102, [99, 98, 97, 96], BLOCK)])  # the next one arrives: a gap before it
        assert wait_until(lambda: resident(subscriber) == 3 and subscriber.index.num_blocks == 4)
        assert subscriber.num_replays >= 1 and subscriber.synced
    finally:
        subscriber.stop()


def test_a_publisher_that_dies_is_a_breaker_and_comes_back_replayed(publisher, caplog):
    subscriber = subscriber_of(publisher)
    try:
        store_prefix(publisher)
        assert wait_until(lambda: resident(subscriber) == 3)
        with caplog.at_level(logging.WARNING, logger="ragcache.engines.vllm_events"):
            publisher.stop()
            assert wait_until(lambda: not subscriber.synced and subscriber.health.is_down)
        assert [r.message for r in caplog.records].count(
            "KV events of http://vllm.test: the publisher went away (residency from warms until they recover)") == 1
        revived = KVPublisher(publisher.port, publisher.replay_port).start()
        try:
            store_prefix(revived, 300)  # a restarted engine: its own sequence, from 0
            assert wait_until(lambda: subscriber.synced and not subscriber.health.is_down and resident(subscriber) == 3)
        finally:
            revived.close()
    finally:
        subscriber.stop()


def test_garbage_costs_a_breaker_and_one_log_line_never_the_subscriber(publisher, caplog):
    subscriber = subscriber_of(publisher, backoff_min_s=5.0, backoff_max_s=5.0)
    try:
        with caplog.at_level(logging.WARNING, logger="ragcache.engines.vllm_events"):
            for payload in (b"\xc1 not msgpack", packb({"not": "a batch"}), packb([1.0, [{"type": "Nope", "block_hashes": []}]]),
                            packb([1.0, [stored([1], None, [1], BLOCK)]])):  # fewer tokens than its block holds
                publisher.send_raw(payload)
            assert wait_until(lambda: subscriber.health.is_down and not subscriber.synced)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "residency from warms" in warnings[0].getMessage()
        assert all(thread.is_alive() for thread in subscriber._threads)
    finally:
        subscriber.stop()


def test_a_flood_of_blocks_beyond_the_bound_clears_the_index_and_opens_the_breaker(publisher):
    subscriber = subscriber_of(publisher, max_blocks=50)
    try:
        store_prefix(publisher)
        assert wait_until(lambda: resident(subscriber) == 3)
        publisher.publish([stored(list(range(1000, 1100)), None, [5] * 400, BLOCK)])  # 100 blocks at once
        assert wait_until(lambda: subscriber.health.is_down and not subscriber.synced)
        assert subscriber.index.num_blocks <= 50
    finally:
        subscriber.stop()


def test_decoding_refuses_what_vllm_never_sends():
    batch = packb([1.5, [stored([7], None, [1, 2, 3, 4], BLOCK), removed([7]), {"type": "AllBlocksCleared"},
                         {**removed([8]), "medium": "CPU"}]])  # an offloading tier's event: not the GPU cache
    events = decode_batch(batch)
    assert [type(e).__name__ for e in events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    for bad in (b"", b"\x92\x01", packb([1.0, ["x"]]), packb([1.0, [{"type": "BlockRemoved", "block_hashes": "no"}]])):
        with pytest.raises(KVEventsError):
            decode_batch(bad)
    for bad in (b"\xdd\xff\xff\xff\xff", b"\x91" * 100 + b"\x00", b"\xa3ab", b"\x81\x90\x00"):
        with pytest.raises(MsgpackError):
            unpackb(bad)


def test_an_engine_restarted_with_a_new_stream_is_never_reported_holding_the_dead_ones_blocks(publisher):
    """Issue 42, item 2: a publisher back with a new stream (its sequence from 0 again, the last batch applied here
    not in its buffer, or another batch under that number) clears the index before the endpoint counts as synced."""
    changes: list[str] = []
    subscriber = subscriber_of(publisher, changes)
    states: list[str] = []
    try:
        store_prefix(publisher)
        publisher.publish([stored([500], None, [7, 7, 7, 7], BLOCK)])
        assert wait_until(lambda: resident(subscriber) == 3 and subscriber.last_seq == 1)
        publisher.stop()
        assert wait_until(lambda: not subscriber.synced)
        restarted = KVPublisher(publisher.port, publisher.replay_port).start()  # an empty engine, its own stream
        try:
            restarted.publish([stored([900], None, [1, 1, 1, 1], BLOCK)])  # seq 0, 1: the same numbers, other batches
            restarted.publish([stored([901], None, [2, 2, 2, 2], BLOCK)])
            while not subscriber.synced:  # every state from the reconnection on: never synced with the old blocks
                states.append(f"{subscriber.state}:{resident(subscriber)}")
                time.sleep(0.001)
            assert resident(subscriber) == 0 and subscriber.index.num_blocks == 2 and subscriber.num_new_streams == 1
            assert wait_until(lambda: changes == ["http://vllm.test"])  # the registry hears of the new cache once synced
        finally:
            restarted.close()
    finally:
        subscriber.stop()
    assert not [state for state in states if state.startswith("synced")]


def test_a_publisher_back_with_the_same_stream_keeps_the_index(publisher):
    subscriber = subscriber_of(publisher)
    try:
        store_prefix(publisher)
        assert wait_until(lambda: resident(subscriber) == 3)
        publisher.stop()  # its sockets go; its buffer and sequence stay (a network blip, not a restart)
        assert wait_until(lambda: not subscriber.synced)
        publisher.start()
        publisher.publish([stored([600], 102, [8, 8, 8, 8], BLOCK)])
        assert wait_until(lambda: subscriber.synced and subscriber.index.num_blocks == 4)
        assert resident(subscriber) == 3 and subscriber.num_new_streams == 0  # proved the same: nothing rebuilt
    finally:
        subscriber.stop()


def test_a_frame_over_the_byte_bound_is_refused_before_it_is_decoded(publisher):
    subscriber = subscriber_of(publisher, max_frame_bytes=4096, backoff_min_s=5.0, backoff_max_s=5.0)
    try:
        publisher.send_raw(b"\x91\xc6" + (8192).to_bytes(4, "big") + b"\x00" * 8192)  # 8 KiB: over the 4 KiB bound
        assert wait_until(lambda: subscriber.health.is_down and not subscriber.synced)
        assert subscriber.num_batches == 0  # libzmq dropped the connection: nothing reached the decoder
    finally:
        subscriber.stop()


def test_a_batch_that_decodes_to_more_than_its_bytes_justify_is_refused():
    """Issue 38, item 5: 1 MiB of empty maps decoded to ~64 MiB of dicts (a 4 MiB frame cost the service +318 MiB)."""
    hostile = b"\x92\x00\xdd" + (1 << 16).to_bytes(4, "big") + b"\x80" * (1 << 16)
    with pytest.raises(KVEventsError, match="more objects than its size allows"):
        decode_batch(hostile)
    with pytest.raises(MsgpackError):
        unpackb(hostile, max_cost=16 * len(hostile))
    assert len(unpackb(hostile)[1]) == 1 << 16  # without a bound it decodes (the reader itself is not the limit)


def test_block_hashes_over_32_bytes_are_refused():
    assert decode_batch(packb([1.0, [stored([b"h" * 32], None, [1, 2, 3, 4], BLOCK)]]))  # vLLM's sha256: 32 bytes
    for bad in (packb([1.0, [stored([b"h" * 33], None, [1, 2, 3, 4], BLOCK)]]), packb([1.0, [removed([b"r" * 4096])]]),
                packb([1.0, [stored([1], b"p" * 64, [1, 2, 3, 4], BLOCK)]])):
        with pytest.raises(KVEventsError, match="block hash"):
            decode_batch(bad)


def test_the_queue_is_bounded_in_bytes():
    subscriber = KVEventSubscriber("http://vllm.test", EventsConfig("tcp://127.0.0.1:1", max_queue_bytes=10_000))
    assert subscriber._enqueue(0, b"x" * 6_000, wait_s=0.0)  # nothing applies it: the subscriber is not started
    assert not subscriber._enqueue(1, b"x" * 6_000, wait_s=0.05)  # 12,000 bytes would wait: a flood
    assert subscriber.state == "out_of_sync" and subscriber.num_failures == 1 and subscriber.last_seq is None
