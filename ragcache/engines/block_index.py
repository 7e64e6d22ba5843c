"""Which KV blocks one vLLM endpoint holds, from its own KV events, and how many of a prefix's blocks are among them.

vLLM names a cached block by a hash chained over the blocks before it (``BlockStored`` carries the new blocks'
hashes, the parent's hash and their token ids; ``BlockRemoved`` the hashes evicted; ``AllBlocksCleared`` a reset).
Its hash function is the engine's own (and seeded per process unless ``PYTHONHASHSEED`` is set), so the registry
cannot compute it for a prefix. It does not need to: each stored block is indexed by a digest of *its token ids and
every token before it* (the parent's digest chained with its own tokens), which the registry can compute for a
prefix from the token ids vLLM's ``/tokenize`` gives. A prefix of ``n`` full blocks is resident as far as its
leading block digests are in the index — exactly what a request starting with the prefix would find cached.

A block whose parent the index never saw (events lost before a replay could fill them in) cannot be placed in a
chain and is not indexed: residency is then under-counted, never over-counted. The index is bounded
(``max_blocks``): more blocks than an engine could hold means a publisher that floods or lies, and the index is
cleared and reported out of sync rather than grown.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BlockIndex", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEvent", "prefix_digests"]

_ROOT = b"\x00" * 16
# Removals remembered by digest (16 bytes each, ~1.5 MiB): far more than happen while one warm is in flight.
MAX_REMEMBERED = 1 << 15


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[object, ...]
    parent_block_hash: object | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[object, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def _chain(parent: bytes, tokens: Sequence[int]) -> bytes:
    packed = struct.pack(f"<{len(tokens)}q", *tokens)
    return hashlib.blake2b(parent + packed, digest_size=16).digest()


def prefix_digests(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The digests of the full blocks of a prompt starting with ``token_ids``, first block first."""
    digests, parent = [], _ROOT
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = _chain(parent, token_ids[start:start + block_size])
        digests.append(parent)
    return digests


class BlockIndex:
    """The blocks one endpoint holds (thread-safe: the subscriber thread applies, request threads read)."""

    def __init__(self, max_blocks: int = 1 << 20) -> None:
        self.max_blocks = max_blocks
        self._lock = threading.Lock()
        self._digest_of: dict[object, bytes] = {}  # vLLM's block hash -> our digest of its tokens and all before
        self._count: dict[bytes, int] = {}  # digest -> blocks holding it (a chain stored twice is counted twice)
        self.block_size: int | None = None
        self.num_unplaced = 0  # stored blocks whose parent was unknown (not indexed)
        self.num_removed = 0
        # digest -> the removal (num_removed) that last took it, for the most recent MAX_REMEMBERED removals; and the
        # removal number of the last clear: whether a block was removed since a moment (:meth:`removed_since`).
        self._removed_at: OrderedDict[bytes, int] = OrderedDict()
        self._cleared_at = 0

    def apply(self, event: KVEvent) -> bool:
        """Apply one event; False when it would pass ``max_blocks`` (the index is then cleared)."""
        with self._lock:
            if isinstance(event, AllBlocksCleared):
                self._clear()
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    self._remove(block_hash)
            else:
                return self._store(event)
        return True

    def _store(self, event: BlockStored) -> bool:
        size = event.block_size
        if size < 1 or len(event.token_ids) < size * len(event.block_hashes):
            raise ValueError("BlockStored: fewer token ids than its blocks hold")
        self.block_size = size
        parent = _ROOT if event.parent_block_hash is None else self._digest_of.get(event.parent_block_hash)
        if parent is None:
            self.num_unplaced += len(event.block_hashes)
            return True
        if len(self._digest_of) + len(event.block_hashes) > self.max_blocks:
            self._clear()
            return False
        for i, block_hash in enumerate(event.block_hashes):
            parent = _chain(parent, event.token_ids[i * size:(i + 1) * size])
            if block_hash in self._digest_of:
                self._remove(block_hash)
            self._digest_of[block_hash] = parent
            self._count[parent] = self._count.get(parent, 0) + 1
        return True

    def _remove(self, block_hash: object) -> None:
        digest = self._digest_of.pop(block_hash, None)
        if digest is None:
            return
        self.num_removed += 1
        self._removed_at[digest] = self.num_removed
        self._removed_at.move_to_end(digest)
        if len(self._removed_at) > MAX_REMEMBERED:
            self._removed_at.popitem(last=False)
        left = self._count.get(digest, 0) - 1
        if left > 0:
            self._count[digest] = left
        else:
            self._count.pop(digest, None)

    def _clear(self) -> None:
        self._digest_of.clear()
        self._count.clear()
        self.num_removed += 1
        self._cleared_at = self.num_removed

    def removed_since(self, digests: Sequence[bytes], mark: int) -> bool:
        """Whether any of ``digests`` was removed (or the index cleared) after the removal numbered ``mark`` (a
        ``num_removed`` read earlier); True, too, when that is too long ago to say."""
        with self._lock:
            if self._cleared_at > mark or (self._removed_at and len(self._removed_at) >= MAX_REMEMBERED and
                                           next(iter(self._removed_at.values())) > mark + 1):
                return True
            return any(self._removed_at.get(digest, 0) > mark for digest in digests)

    def clear(self) -> None:
        """Forget every block (the engine restarted, or events were lost beyond replay)."""
        with self._lock:
            self._clear()

    def resident_blocks(self, digests: Sequence[bytes]) -> int:
        """How many of a prefix's leading blocks (``prefix_digests``) are held."""
        with self._lock:
            num = 0
            for digest in digests:
                if digest not in self._count:
                    break
                num += 1
            return num

    @property
    def num_blocks(self) -> int:
        with self._lock:
            return len(self._digest_of)
