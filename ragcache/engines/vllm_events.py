"""A subscriber to one vLLM endpoint's KV events (``--kv-events-config``, ZMQ), feeding a :class:`~.block_index.BlockIndex`.

The wire format (the PUB socket's ``(topic, seq, payload)``, the replay ROUTER's answers, the payload's MessagePack
batches) is decoded by :mod:`.vllm_wire`.

What can go wrong with a publisher is treated as with any upstream: a payload that does not decode (or would decode
to more objects than its bytes justify), an event that makes no sense (a block hash over 32 bytes), a frame over
``max_frame_bytes`` or a flood beyond the queue's bounds (in batches and in bytes) costs a counted failure on the
endpoint's breaker and one log line, and the index is marked out of sync (residency is then unknown there, and the
registry falls back to what its warms measure); a gap in the sequence (messages lost) is filled from the replay
socket; a publisher that goes away (the socket monitor says disconnected) leaves the index out of sync until it is
back, its stream proved the same or the index rebuilt from its new one. Nothing of it ever raises into the registry:
the subscriber runs in its own thread.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ragcache.core.health import TierHealth

from .block_index import BlockIndex, BlockStored, KVEvent
from .vllm_wire import EventsConfig, KVEventsError, decode_batch

__all__ = ["KVEventSubscriber"]

log = logging.getLogger(__name__)

_END_SEQ = -1


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class KVEventSubscriber:
    """Subscribes to one endpoint's events in a daemon thread and applies them to :attr:`index`.

    :attr:`state` is ``synced`` while the index is known to mirror the engine (connected, everything the publisher
    sent applied, no loss a replay could not fill), ``syncing`` from a (re)connection until the replay that proves
    the stream is the one the index holds (or rebuilds it from a new one) is applied, ``out_of_sync`` otherwise; the
    registry trusts the index only when synced. A publisher that comes back with another stream (an engine restarted:
    its sequence starts again, its buffer does not hold the last batch applied here, or holds another one under its
    number) has its index cleared before it counts as synced: nothing the dead engine held is reported held by the new
    one. ``on_change`` is called (from a subscriber thread) after each batch that removed or cleared blocks, and after
    such a rebuild: the registry warms what was evicted.
    """

    def __init__(self, base_url: str, config: EventsConfig, *, on_change: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_url = base_url
        self.config = config
        self.index = BlockIndex(config.max_blocks)
        self.health = TierHealth(backoff_initial_s=config.backoff_min_s, backoff_max_s=config.backoff_max_s, clock=clock)
        self._on_change = on_change
        self._clock = clock
        self._queue: queue.Queue[tuple[int, bytes]] = queue.Queue()
        self._room = threading.Condition()  # guards _queued_bytes; notified as the applying thread takes a batch
        self._queued_bytes = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._state = "out_of_sync"
        # The last batch enqueued after which the index counts as synced (set at the end of a replay); None: none due.
        self._sync_at: int | None = None
        # Set by the applying thread when a batch could not be applied: the receiving thread then starts the index
        # over from the publisher's whole buffer (it alone touches last_seq and the sockets).
        self._rebuild = threading.Event()
        # Set at each session's start: the stream is proved (or the index rebuilt) before anything received counts.
        self._unproved = True
        self.last_seq: int | None = None
        self._last_digest: bytes | None = None  # of the payload at last_seq: the proof that a stream goes on
        self._rebuilt = False  # the index was cleared for another stream: the registry hears of it once synced
        self.num_batches = 0
        self.num_events = 0
        self.num_failures = 0
        self.num_replays = 0
        self.num_new_streams = 0  # publishers that came back with another stream (the index cleared)
        self.last_event_at: float | None = None

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    @property
    def synced(self) -> bool:
        return self.state == "synced"

    def _set_state(self, value: str) -> None:
        with self._lock:
            self._state = value
            if value != "syncing":
                self._sync_at = None

    def _synced_once_applied(self) -> None:
        """Synced once the applying thread has applied the last batch enqueued (at once when none is waiting)."""
        with self._lock:
            if self._queue.empty() or self.last_seq is None:
                self._state, self._sync_at = "synced", None
            else:
                self._state, self._sync_at = "syncing", self.last_seq
                return
        self._synced_now()

    def _synced_now(self) -> None:
        # A rebuilt index (another stream: the engine's cache is new) is news to the registry once it can be read.
        if self._rebuilt:
            self._rebuilt = False
            self._changed()

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
        with self._room:
            self._room.notify_all()
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
                self._set_state("out_of_sync")
                self._failed(f"{type(exc).__name__}: {exc}")
            except Exception:  # the thread must survive anything; the next session starts over
                self._set_state("out_of_sync")
                self._failed("the subscriber failed unexpectedly")
                log.exception("KV events of %s: the subscriber failed unexpectedly", self.base_url)

    def _session(self, context: Any) -> None:
        """One connection: subscribe, prove the stream (or rebuild), then receive until a failure or stop."""
        import zmq

        self._unproved = True
        if self._rebuild.is_set():  # the last session's index could not be applied: this one starts it over
            self._rebuild.clear()
            self._forget_stream()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, self.config.max_frame_bytes)
        # What libzmq itself buffers for us, in messages: a publisher faster than the index loses the excess (a gap,
        # filled from the replay) instead of growing this process.
        sub.setsockopt(zmq.RCVHWM, max(16, self.config.max_queue_bytes // self.config.max_frame_bytes))
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
                    self._receive(sub.recv_multipart(zmq.NOBLOCK, copy=True))
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    def _start_over(self) -> None:
        self._rebuild.clear()
        self._forget_stream()
        if self.config.replay_endpoint is not None:
            self._replay(0)

    def _forget_stream(self) -> None:
        """Clear the index and everything waiting for it: what follows is applied to an empty index."""
        self._set_state("syncing")
        self._drain()
        self.index.clear()
        self.last_seq = self._last_digest = None

    def _monitor_event(self, monitor: Any) -> bool:
        """React to a connect or disconnect; False ends the session (the publisher went away)."""
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        event = recv_monitor_message(monitor)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            self._set_state("out_of_sync")
            self._failed("the publisher went away")
            return False
        if event == zmq.EVENT_CONNECTED and self._unproved:
            self._resync_after_connect()
        return True

    def _resync_after_connect(self) -> None:
        """What happened while we were away is unknown: prove that the publisher's stream is the one the index holds
        (its replay holds our last batch, byte for byte), or clear the index and rebuild it from the new stream."""
        self._unproved = False
        self._set_state("syncing")
        if self.last_seq is None:
            if self.config.replay_endpoint is None:
                self._synced_once_applied()  # nothing missed: the engine's cache starts empty with its publisher
                self._succeeded()
            else:
                self._replay(0)
            return
        if self.config.replay_endpoint is None:
            # Nothing can prove the stream goes on: start empty (a restarted engine is; after a blip this under-counts).
            self._new_stream("reconnected, and no replay socket proves the stream goes on")
            self._synced_once_applied()
            self._succeeded()
            return
        if not self._replay(self.last_seq, proof=self._last_digest):
            self._new_stream("its replay does not hold the last batch applied here")
            self._replay(0)

    def _new_stream(self, why: str) -> None:
        self.num_new_streams += 1
        log.info("KV events of %s: another stream (%s); the index starts over", self.base_url, why)
        self._forget_stream()
        self._rebuilt = True

    def _receive(self, frames: list[bytes]) -> None:
        if self._unproved:
            self._resync_after_connect()  # a batch before the monitor said connected: prove the stream first
        if len(frames) != 3 or len(frames[1]) != 8:
            self._failed("a message that is not (topic, seq, payload)")
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if self.last_seq is not None and seq > self.last_seq + 1:
            self._replay(self.last_seq + 1)  # a gap: messages lost on the way
        elif self.last_seq is not None and seq <= self.last_seq:
            if seq < self.last_seq - 1:  # counted back: the engine restarted, and its cache with it
                self._new_stream(f"its sequence went back from {self.last_seq} to {seq}")
                self._synced_once_applied()
            else:
                return  # already applied (a replay overlapping the live stream)
        self._enqueue(seq, frames[2], wait_s=self.config.replay_timeout_s / 4)

    def _enqueue(self, seq: int, payload: bytes, *, wait_s: float) -> bool:
        """Queue one batch for the index, waiting up to ``wait_s`` for room; False (out of sync, the index cleared,
        to be rebuilt) when there is none."""
        deadline = self._clock() + wait_s
        with self._room:
            while (self._queue.qsize() >= self.config.max_queue or
                   self._queued_bytes + len(payload) > self.config.max_queue_bytes) and self._queue.qsize():
                left = deadline - self._clock()
                if left <= 0 or self._stop.is_set():
                    break
                self._room.wait(left)
            else:
                self._queued_bytes += len(payload)
                self._queue.put((seq, payload))
                self.last_seq, self._last_digest = seq, _digest(payload)
                return True
        # The index cannot keep up (a flood): stop trusting it and start over from the replay.
        self._set_state("out_of_sync")
        self._failed(f"more than {self.config.max_queue} batches or {self.config.max_queue_bytes} bytes waiting (a flood)")
        self._drain()
        self.index.clear()
        self.last_seq = self._last_digest = None
        self._rebuild.set()
        return False

    def _drain(self) -> None:
        with self._room:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self._queued_bytes = 0
            self._room.notify_all()

    def _replay(self, start_seq: int, *, proof: bytes | None = None) -> bool:
        """Ask the replay socket for everything from ``start_seq`` and queue what the index misses; out of sync when
        it cannot fill the gap. With ``proof`` (the digest of the batch at ``start_seq`` as applied here): False, having
        queued nothing, when the publisher does not hold that very batch there (another stream)."""
        import zmq

        if self.config.replay_endpoint is None:
            self._set_state("out_of_sync")
            log.warning("KV events of %s: messages lost and no replay endpoint; residency unknown", self.base_url)
            return True
        self.num_replays += 1
        dealer: Any = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.config.max_frame_bytes)
        try:
            dealer.connect(self.config.replay_endpoint)
            dealer.send_multipart((b"", start_seq.to_bytes(8, "big", signed=True)))
            first: int | None = None
            while True:
                if not dealer.poll(max(1, int(self.config.replay_timeout_s * 1000))):
                    break
                frames = dealer.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    raise KVEventsError("a replay message that is not (b'', topic, seq, payload)")
                seq = int.from_bytes(frames[2], "big", signed=True)
                if proof is not None:
                    if seq != start_seq or _digest(frames[3]) != proof:
                        return False  # not the batch applied here under that number (or nothing): another stream
                    proof = None
                    first = seq
                    continue  # applied already
                if seq == _END_SEQ:
                    # Synced when the replay reached back to what we asked for (or the publisher keeps nothing older).
                    if first is None or first <= start_seq or self.last_seq is None:
                        if self.last_seq is None:
                            self.last_seq = start_seq - 1  # everything before start_seq is known: a later gap is seen
                        self._synced_once_applied()
                    else:
                        self._set_state("out_of_sync")
                    self._succeeded()
                    return True
                first = seq if first is None else first
                if (self.last_seq is None or seq > self.last_seq) and \
                        not self._enqueue(seq, frames[3], wait_s=self.config.replay_timeout_s):
                    return True
            if proof is not None:
                return False  # the publisher sent nothing at all: nothing proves the stream goes on
            self._set_state("out_of_sync")
            self._failed("the replay did not end in time")
            return True
        finally:
            dealer.close(0)

    def _apply_loop(self) -> None:
        while not self._stop.is_set():
            try:
                seq, payload = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            with self._room:
                self._queued_bytes = max(0, self._queued_bytes - len(payload))  # a drain may have zeroed it meanwhile
                self._room.notify_all()
            try:
                events = decode_batch(payload, self.config.max_decoded_bytes_per_byte)
                changed = self._apply(events)
            except (KVEventsError, ValueError) as exc:
                self._set_state("out_of_sync")
                self._failed(str(exc))
                self._rebuild.set()
                continue
            with self._lock:
                synced_now = self._sync_at is not None and seq >= self._sync_at
                if synced_now:
                    self._state, self._sync_at = "synced", None
            if synced_now:
                self._synced_now()
            if changed:
                self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
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
