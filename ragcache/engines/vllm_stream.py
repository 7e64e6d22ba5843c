"""The receiving half of a :class:`~.vllm_events.KVEventSubscriber`: vLLM's sockets, the sequence and its proof.

One daemon thread connects the PUB socket (with a monitor that says connected or disconnected), notices a gap in
the sequence (messages lost: filled from the replay ROUTER), a sequence that counts back (an engine restarted), and
after each (re)connection proves that the publisher's stream is the one the index holds (its replay holds the last
batch queued here, byte for byte) or has the index rebuilt from the new one. It owns the sockets and the sequence;
what it learns it hands to the subscriber (:class:`StreamSink`), which owns the sync state, the queue to the index
and the counts. It never touches the index.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Protocol

from ragcache.core.health import TierHealth

from .vllm_wire import EventsConfig, KVEventsError

__all__ = ["KVEventStream", "StreamSink"]

log = logging.getLogger(__name__)

_END_SEQ = -1


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class StreamSink(Protocol):
    """What the receiving thread tells the subscriber (the subscriber's state, queue and counts)."""

    base_url: str
    config: EventsConfig
    health: TierHealth
    num_replays: int

    def _set_state(self, value: str) -> None: ...

    def _synced_once_applied(self, last_seq: int | None) -> None: ...

    def _enqueue(self, seq: int, payload: bytes, *, wait_s: float) -> bool: ...

    def _forget_stream(self) -> None: ...

    def _new_stream(self, why: str) -> None: ...

    def _succeeded(self) -> None: ...

    def _failed(self, why: str) -> None: ...


class KVEventStream:
    """Receives one endpoint's batches (:meth:`run`, in the subscriber's receiving thread) and queues them in order.

    ``stop`` ends :meth:`run`; ``rebuild`` is set (by the subscriber) when the index must start over from the
    publisher's whole buffer: this thread alone touches :attr:`last_seq` and the sockets, so it does the starting over.
    """

    def __init__(self, sink: StreamSink, *, stop: threading.Event, rebuild: threading.Event) -> None:
        self._sink = sink
        self._config = sink.config
        self._stop = stop
        self._rebuild = rebuild
        # Set at each session's start: the stream is proved (or the index rebuilt) before anything received counts.
        self._unproved = True
        self.last_seq: int | None = None  # the last batch queued for the index
        self._last_digest: bytes | None = None  # of the payload at last_seq: the proof that a stream goes on

    def run(self) -> None:
        """Connect, receive and reconnect until ``stop``, as the endpoint's breaker allows; never raises."""
        import zmq  # pyzmq: needed only where an endpoint publishes events

        context: Any = zmq.Context.instance()
        while not self._stop.is_set():
            if not self._sink.health.may_try():
                self._stop.wait(0.05)
                continue
            try:
                self._session(context)
            except (zmq.ZMQError, KVEventsError, ValueError, OSError) as exc:  # what a publisher can make happen
                self._sink._set_state("out_of_sync")
                self._sink._failed(f"{type(exc).__name__}: {exc}")
            except Exception:  # the thread must survive anything; the next session starts over
                self._sink._set_state("out_of_sync")
                self._sink._failed("the subscriber failed unexpectedly")
                log.exception("KV events of %s: the subscriber failed unexpectedly", self._sink.base_url)

    def enqueue(self, seq: int, payload: bytes, *, wait_s: float) -> bool:
        """Queue one batch and remember it as the last; False (the index cleared, to be rebuilt) on a flood."""
        if not self._sink._enqueue(seq, payload, wait_s=wait_s):
            self.last_seq = self._last_digest = None
            return False
        self.last_seq, self._last_digest = seq, _digest(payload)
        return True

    def _session(self, context: Any) -> None:
        """One connection: subscribe, prove the stream (or rebuild), then receive until a failure or stop."""
        import zmq

        self._unproved = True
        if self._rebuild.is_set():  # the last session's index could not be applied: this one starts it over
            self._rebuild.clear()
            self._forget_stream()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, self._config.max_frame_bytes)
        # What libzmq itself buffers for us, in messages: a publisher faster than the index loses the excess (a gap,
        # filled from the replay) instead of growing this process.
        sub.setsockopt(zmq.RCVHWM, max(16, self._config.max_queue_bytes // self._config.max_frame_bytes))
        sub.setsockopt(zmq.SUBSCRIBE, self._config.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(self._config.endpoint)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set() and self._sink.health.may_try():
                if self._rebuild.is_set():
                    self._start_over()
                ready = dict(poller.poll(self._config.poll_ms))
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
        if self._config.replay_endpoint is not None:
            self._replay(0)

    def _forget_stream(self) -> None:
        self._sink._forget_stream()
        self.last_seq = self._last_digest = None

    def _new_stream(self, why: str) -> None:
        self._sink._new_stream(why)
        self.last_seq = self._last_digest = None

    def _synced_once_applied(self) -> None:
        self._sink._synced_once_applied(self.last_seq)

    def _monitor_event(self, monitor: Any) -> bool:
        """React to a connect or disconnect; False ends the session (the publisher went away)."""
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        event = recv_monitor_message(monitor)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            self._sink._set_state("out_of_sync")
            self._sink._failed("the publisher went away")
            return False
        if event == zmq.EVENT_CONNECTED and self._unproved:
            self._resync_after_connect()
        return True

    def _resync_after_connect(self) -> None:
        """What happened while we were away is unknown: prove that the publisher's stream is the one the index holds
        (its replay holds our last batch, byte for byte), or clear the index and rebuild it from the new stream."""
        self._unproved = False
        self._sink._set_state("syncing")
        if self.last_seq is None:
            if self._config.replay_endpoint is None:
                self._synced_once_applied()  # nothing missed: the engine's cache starts empty with its publisher
                self._sink._succeeded()
            else:
                self._replay(0)
            return
        if self._config.replay_endpoint is None:
            # Nothing can prove the stream goes on: start empty (a restarted engine is; after a blip this under-counts).
            self._new_stream("reconnected, and no replay socket proves the stream goes on")
            self._synced_once_applied()
            self._sink._succeeded()
            return
        if not self._replay(self.last_seq, proof=self._last_digest):
            self._new_stream("its replay does not hold the last batch applied here")
            self._replay(0)

    def _receive(self, frames: list[bytes]) -> None:
        if self._unproved:
            self._resync_after_connect()  # a batch before the monitor said connected: prove the stream first
        if len(frames) != 3 or len(frames[1]) != 8:
            self._sink._failed("a message that is not (topic, seq, payload)")
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
        self.enqueue(seq, frames[2], wait_s=self._config.replay_timeout_s / 4)

    def _replay(self, start_seq: int, *, proof: bytes | None = None) -> bool:
        """Ask the replay socket for everything from ``start_seq`` and queue what the index misses; out of sync when
        it cannot fill the gap. With ``proof`` (the digest of the batch at ``start_seq`` as applied here): False, having
        queued nothing, when the publisher does not hold that very batch there (another stream)."""
        import zmq

        if self._config.replay_endpoint is None:
            self._sink._set_state("out_of_sync")
            log.warning("KV events of %s: messages lost and no replay endpoint; residency unknown", self._sink.base_url)
            return True
        self._sink.num_replays += 1
        dealer: Any = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self._config.max_frame_bytes)
        try:
            dealer.connect(self._config.replay_endpoint)
            dealer.send_multipart((b"", start_seq.to_bytes(8, "big", signed=True)))
            first: int | None = None
            while True:
                if not dealer.poll(max(1, int(self._config.replay_timeout_s * 1000))):
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
                        self._sink._set_state("out_of_sync")
                    self._sink._succeeded()
                    return True
                first = seq if first is None else first
                if (self.last_seq is None or seq > self.last_seq) and \
                        not self.enqueue(seq, frames[3], wait_s=self._config.replay_timeout_s):
                    return True
            if proof is not None:
                return False  # the publisher sent nothing at all: nothing proves the stream goes on
            self._sink._set_state("out_of_sync")
            self._sink._failed("the replay did not end in time")
            return True
        finally:
            dealer.close(0)
