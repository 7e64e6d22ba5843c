"""A loopback publisher of vLLM's KV events, of the tests' own: vLLM's wire format (a PUB socket sending
``(topic, seq, payload)``, a ROUTER replay socket, MessagePack ``EventBatch`` arrays of tagged maps), with the faults a
real one can have: it dies, floods, skips sequence numbers, or sends garbage."""

from __future__ import annotations

import struct
import threading
import time

import zmq


def packb(value: object) -> bytes:
    """MessagePack of the few types vLLM's events hold (the encoder msgspec would use)."""
    if value is None:
        return b"\xc0"
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        if 0 <= value <= 0x7F:
            return bytes([value])
        return b"\xd3" + struct.pack(">q", value) if value < 0 else b"\xcf" + struct.pack(">Q", value)
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, bytes):
        return b"\xc6" + struct.pack(">I", len(value)) + value
    if isinstance(value, str):
        raw = value.encode()
        return b"\xdb" + struct.pack(">I", len(raw)) + raw
    if isinstance(value, (list, tuple)):
        return b"\xdd" + struct.pack(">I", len(value)) + b"".join(packb(v) for v in value)
    if isinstance(value, dict):
        return b"\xdf" + struct.pack(">I", len(value)) + b"".join(packb(k) + packb(v) for k, v in value.items())
    raise TypeError(type(value))


def stored(hashes: list[int], parent: int | None, tokens: list[int], block_size: int) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None}


def removed(hashes: list[int]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def _bind(socket: zmq.Socket, port: int) -> int:
    """Bind on loopback: to ``port``, or to any free one when it is 0; returns the port bound."""
    if port:
        socket.bind(f"tcp://127.0.0.1:{port}")
        return port
    return socket.bind_to_random_port("tcp://127.0.0.1")


class KVPublisher:
    """PUB on ``endpoint`` and ROUTER replay on ``replay_endpoint``, like vLLM's ZmqEventPublisher."""

    def __init__(self, port: int = 0, replay_port: int = 0) -> None:
        # Port 0: each socket binds to a random port, trying others while one is taken. A port picked beforehand
        # (a free_port() call) can be taken by another process before the bind: CI failed once with EADDRINUSE.
        self.port, self.replay_port = port, replay_port
        self.endpoint = self.replay_endpoint = ""
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.num_replays = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._context = zmq.Context()
        self._pub = self._replay = None
        self._thread: threading.Thread | None = None

    def start(self) -> KVPublisher:
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self.port = _bind(self._pub, self.port)
        self._replay = self._context.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self.replay_port = _bind(self._replay, self.replay_port)
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.replay_endpoint = f"tcp://127.0.0.1:{self.replay_port}"
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Die: both sockets closed (a subscriber sees the disconnect)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._pub.close(0)
            self._replay.close(0)

    def close(self) -> None:
        self.stop()
        self._context.term()

    def publish(self, events: list[dict], *, skip_wire: bool = False) -> int:
        """One batch; ``skip_wire`` buffers it for replay without sending it (a message lost on the way)."""
        payload = packb([time.time(), events])
        return self.send_raw(payload, skip_wire=skip_wire)

    def send_raw(self, payload: bytes, *, skip_wire: bool = False) -> int:
        with self._lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
            if not skip_wire:
                self._pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
            return seq

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self._replay.poll(0):
                    ready = False
                else:
                    ready = True
                    client, _, start = self._replay.recv_multipart()
                    start_seq = int.from_bytes(start, "big", signed=True)
                    self.num_replays += 1
                    for seq, payload in self.buffer:
                        if seq >= start_seq:
                            self._replay.send_multipart((client, b"", b"", seq.to_bytes(8, "big"), payload))
                    self._replay.send_multipart((client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""))
            if not ready:
                time.sleep(0.01)
