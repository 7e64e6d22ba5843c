"""A subscriber to one vLLM endpoint's KV events (``--kv-events-config``, ZMQ), feeding a :class:`~.block_index.BlockIndex`.

Two threads: the receiving one (:mod:`.vllm_stream`: the sockets, the sequence, its proof after a reconnection, the
replay) queues the payloads in order; the applying one (here) decodes them (:mod:`.vllm_wire`) and applies them to the
index. The subscriber owns what both share: the sync state, the queue between them (bounded in batches and bytes),
the endpoint's breaker and the counts.

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

import logging
import queue
import threading
import time
from collections.abc import Callable

from ragcache.core.health import TierHealth

from .block_index import BlockIndex, BlockStored, KVEvent
from .vllm_stream import KVEventStream
from .vllm_wire import EventsConfig, KVEventsError, decode_batch

__all__ = ["KVEventSubscriber"]

log = logging.getLogger(__name__)

class KVEventSubscriber:
    """Subscribes to one endpoint's events in daemon threads and applies them to :attr:`index`.

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
        self._stream = KVEventStream(self, stop=self._stop, rebuild=self._rebuild)
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

    @property
    def last_seq(self) -> int | None:
        """The last batch queued for the index (None: none since the index last started over)."""
        return self._stream.last_seq

    def start(self) -> None:
        """Start the receiving and the applying thread (idempotent)."""
        if self._threads:
            return
        self._stop.clear()
        for name, run in (("recv", self._stream.run), ("apply", self._apply_loop)):
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

    # ----- the sync state (told by the receiving thread, :class:`~.vllm_stream.StreamSink`) -------------------------

    def _set_state(self, value: str) -> None:
        with self._lock:
            self._state = value
            if value != "syncing":
                self._sync_at = None

    def _synced_once_applied(self, last_seq: int | None) -> None:
        """Synced once the applying thread has applied ``last_seq``, the last batch enqueued (at once when none is
        waiting)."""
        with self._lock:
            if self._queue.empty() or last_seq is None:
                self._state, self._sync_at = "synced", None
            else:
                self._state, self._sync_at = "syncing", last_seq
                return
        self._synced_now()

    def _synced_now(self) -> None:
        # A rebuilt index (another stream: the engine's cache is new) is news to the registry once it can be read.
        if self._rebuilt:
            self._rebuilt = False
            self._changed()

    def _forget_stream(self) -> None:
        """Clear the index and everything waiting for it: what follows is applied to an empty index."""
        self._set_state("syncing")
        self._drain()
        self.index.clear()

    def _new_stream(self, why: str) -> None:
        self.num_new_streams += 1
        log.info("KV events of %s: another stream (%s); the index starts over", self.base_url, why)
        self._forget_stream()
        self._rebuilt = True

    # ----- the queue between the threads -------------------------------------------------------------------------

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
                return True
        # The index cannot keep up (a flood): stop trusting it and start over from the replay.
        self._set_state("out_of_sync")
        self._failed(f"more than {self.config.max_queue} batches or {self.config.max_queue_bytes} bytes waiting (a flood)")
        self._drain()
        self.index.clear()
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

    # ----- the applying thread -----------------------------------------------------------------------------------

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

    # ----- the endpoint's breaker --------------------------------------------------------------------------------

    def _succeeded(self) -> None:
        if self.health.record_success():
            log.info("KV events of %s are back", self.base_url)

    def _failed(self, why: str) -> None:
        """Count a failure on the endpoint's breaker; one log line per outage, not per bad frame."""
        self.num_failures += 1
        if self.health.record_failure(KVEventsError(why)):
            log.warning("KV events of %s: %s (residency from warms until they recover)", self.base_url, why)
