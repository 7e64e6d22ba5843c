"""L1's key -> row map and its exact LRU order, kept in numpy arrays and worked a whole batch at a time.

Why not a dict: a Python dict (or OrderedDict) of a million key strings is looked up one key after another,
and each lookup waits on a cache miss or three (the hash slot, the stored key, the recency node). At 1M
entries that made a 32-key lookup cost about 2.2x what it costs at 10k. Here a batch's keys are probed
together with numpy gathers, whose independent loads the CPU overlaps, so the cost hardly grows with size.

- Keys are identified by the xxh3-128 digest of the key string, as two uint64 words (``key_digests``, made by
  the caller: a request's ``KeyList`` makes them once); a collision is as
  likely as one of the text hashes keys are built from (ragcache.core.keys), which nothing relies on either.
- The map is open addressing with linear probing over a power-of-two table, live keys at most half of it;
  deleted slots are tombstones, and the table is rebuilt when live plus deleted pass 3/4.
- Recency is exact: each use stamps the row with the next tick and appends (tick, row) to a log. The log
  in order is the use history; an entry whose tick is no longer its row's stamp is stale. The least
  recently used rows are the first fresh entries of the log, so eviction reads it from the head. The log is
  compacted (stale entries dropped, order kept) when it fills up.
- The per-request loops (``find``, ``find_hits``, ``touch``) run compiled where ``pip install`` could build
  ``_lru_kernels`` (a C compiler on the machine): one call instead of some fifteen numpy calls of about a
  microsecond each. Without it, their twin ``_lru_loops`` runs the same loops as numpy batch operations, chosen once
  at import (``LRU_KERNELS``, ``ragcache.observe.compiled``); both give the same rows and the same order
  (tests/tiers/test_lru_index.py runs every test on both).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from ragcache.observe.compiled import choose
from ragcache.tiers import _lru_loops

# Built by `pip install` where a C compiler is; numpy does the same work otherwise (a warning says so at import).
LRU_KERNELS = choose("lru_kernels", "ragcache.tiers._lru_kernels", _lru_loops)
compiled_kernels = LRU_KERNELS.compiled

__all__ = ["LRU_KERNELS", "LruIndex", "compiled_kernels"]

EMPTY = -1
DELETED = -2
_LOG_FACTOR = 2  # log capacity in rows: compaction runs at most once per num_rows uses


class LruIndex:
    """Rows ``0..num_rows-1`` of a slab: which key holds each, found for many keys at once, in exact LRU order.

    Not thread-safe: the owner (``MemoryTier``) holds one lock around every call.
    """

    def __init__(self, num_rows: int, *, kernels: ModuleType = LRU_KERNELS.serving):
        self.num_rows = num_rows
        self._kernels = kernels  # _lru_kernels or its twin _lru_loops: the same functions
        # Live keys fill at most half the table and live plus deleted slots at most 3/4 of it, so a rebuild
        # comes at most once per num_rows / 2 evictions.
        size = 64
        while size < num_rows * 2:
            size *= 2
        self._mask = np.uint64(size - 1)  # numpy's operand; the compiled loops and the wrap-around take the int
        self._mask_int = size - 1
        self._hi = np.zeros(size, dtype=np.uint64)
        self._lo = np.zeros(size, dtype=np.uint64)
        self._slot_row = np.full(size, EMPTY, dtype=np.int32)
        self._row_slot = np.full(num_rows, EMPTY, dtype=np.int64)
        self._num_deleted = 0
        self._stamp = np.zeros(num_rows, dtype=np.int64)  # 0 = the row is free
        self._tick = 0
        self._log_rows = np.empty(num_rows * _LOG_FACTOR + 64, dtype=np.int32)
        self._log_ticks = np.empty(num_rows * _LOG_FACTOR + 64, dtype=np.int64)
        self._head = 0
        self._tail = 0
        self._free = np.arange(num_rows, dtype=np.int64)  # rows never used since the start (or a clear)
        self._num_used = 0  # rows handed out from _free: rows[:num_used] have been used
        self.num_live = 0

    # ---- lookups ---------------------------------------------------------------------------------------

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The row of each digest in ``keys`` (``[n, 2]``), or -1 where it is not resident."""
        rows = np.empty(len(keys), dtype=np.int64)
        self._kernels.find(np.ascontiguousarray(keys, dtype=np.uint64), self._hi, self._lo, self._slot_row, self._mask_int, rows)
        return rows

    def find_hits(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positions in ``keys`` of the resident ones, and their rows, in order."""
        positions, rows = np.empty(len(keys), dtype=np.int64), np.empty(len(keys), dtype=np.int64)
        num_hits = self._kernels.find_hits(np.ascontiguousarray(keys, dtype=np.uint64), self._hi, self._lo, self._slot_row,
                                           self._mask_int, positions, rows)
        return positions[:num_hits], rows[:num_hits]

    # ---- recency -----------------------------------------------------------------------------------------

    def touch(self, rows: np.ndarray) -> None:
        """Mark ``rows`` used, in order (the last is the most recent)."""
        count = len(rows)
        if not count:
            return
        if self._tail + count > len(self._log_rows):
            if len(set(rows.tolist())) != count:  # one entry per row, at its last use: at most num_rows entries
                reversed_first = np.unique(rows[::-1], return_index=True)[1]
                rows = rows[np.sort(count - 1 - reversed_first)]
                count = len(rows)
            if self._tail + count > len(self._log_rows):
                self._compact_log()  # leaves at most num_rows entries in a log of 2 * num_rows + 64
        # In order, one log entry per use: a row used twice keeps its later tick and its first entry is stale.
        self._kernels.touch(np.ascontiguousarray(rows, dtype=np.int64), self._stamp, self._log_rows, self._log_ticks,
                            self._tail, self._tick)
        self._tail += count
        self._tick += count

    def lru_rows(self) -> np.ndarray:
        """Resident rows from least to most recently used."""
        rows = self._log_rows[self._head : self._tail]
        fresh = self._stamp[rows] == self._log_ticks[self._head : self._tail]
        return rows[fresh].astype(np.int64)

    def _compact_log(self) -> None:
        rows = self.lru_rows()
        self._log_rows[: len(rows)] = rows
        self._log_ticks[: len(rows)] = self._stamp[rows]
        self._head, self._tail = 0, len(rows)

    # ---- changes -----------------------------------------------------------------------------------------

    def insert(self, keys: np.ndarray) -> np.ndarray:
        """Give each of ``keys`` (distinct, none resident) a row, evicting the least recently used rows when
        none is free; returns the rows, in order, now the most recently used. At most ``num_rows`` keys."""
        count = len(keys)
        rows = np.empty(count, dtype=np.int64)
        # A row, once used, stays in use until it is evicted and reused at once: free rows are never returned.
        num_free = min(count, self.num_rows - self._num_used)
        rows[:num_free] = self._free[self._num_used : self._num_used + num_free]
        self._num_used += num_free
        if num_free < count:
            rows[num_free:] = self._evict(count - num_free)
        self._place(keys, rows)
        self.num_live += count
        self.touch(rows)
        return rows

    def _evict(self, count: int) -> np.ndarray:
        """The ``count`` least recently used rows, removed from the map: the first fresh entries of the log,
        read from its head in chunks (the log before the last victim is then all stale, and is skipped)."""
        found: list[np.ndarray] = [np.empty(0, dtype=np.int64)]
        need, position = count, self._head
        while need:
            end = min(self._tail, position + max(4 * need, 1024))
            if end == position:
                raise AssertionError(f"the LRU log holds {count - need} resident rows, {count} were to be evicted")
            rows = self._log_rows[position:end]
            fresh = np.flatnonzero(self._stamp[rows] == self._log_ticks[position:end])[:need]
            found.append(rows[fresh].astype(np.int64))
            need -= len(fresh)
            position = position + int(fresh[-1]) + 1 if need == 0 else end
        self._head = position
        victims = np.concatenate(found)
        self._drop(victims)
        self.num_live -= count
        return victims

    def _drop(self, rows: np.ndarray) -> None:
        self._slot_row[self._row_slot[rows]] = DELETED
        self._row_slot[rows] = EMPTY
        self._stamp[rows] = 0
        self._num_deleted += len(rows)

    def _place(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Write keys into the table: each takes the first empty or deleted slot on its probe path. Keys
        that want the same slot in one round are settled by order: the first takes it, the rest probe on."""
        if (self.num_live + self._num_deleted + len(keys)) * 4 > len(self._slot_row) * 3:
            self._rebuild()
        slots = (keys[:, 1] & self._mask).astype(np.int64)
        pending = np.arange(len(keys))
        while len(pending):
            at = slots[pending]
            open_ = self._slot_row[at] < 0
            candidates, wanted = pending[open_], at[open_]
            taken_slots, first = np.unique(wanted, return_index=True)
            winners = candidates[first]
            reused = int((self._slot_row[taken_slots] == DELETED).sum())
            self._num_deleted -= reused
            self._hi[taken_slots] = keys[winners, 0]
            self._lo[taken_slots] = keys[winners, 1]
            self._slot_row[taken_slots] = rows[winners]
            self._row_slot[rows[winners]] = taken_slots
            placed = np.zeros(len(keys), dtype=bool)
            placed[winners] = True
            pending = pending[~placed[pending]]
            slots[pending] = (slots[pending] + 1) & self._mask_int

    def _rebuild(self) -> None:
        """A fresh table of the live keys only (tombstones gone); rows and recency unchanged."""
        live = np.flatnonzero(self._slot_row >= 0)
        keys = np.stack([self._hi[live], self._lo[live]], axis=1)
        rows = self._slot_row[live].astype(np.int64)
        self._hi[:] = 0
        self._lo[:] = 0
        self._slot_row[:] = EMPTY
        self._num_deleted = 0
        live_count, self.num_live = self.num_live, 0
        self._place(keys, rows)
        self.num_live = live_count

    def clear(self) -> None:
        """Forget every key, keeping the arrays: new ones would be fresh pages, each faulted in again on
        first use (on a VM, a nested page walk a page), which the first batches after a clear would pay."""
        self._hi.fill(0)
        self._lo.fill(0)
        self._slot_row.fill(EMPTY)
        self._row_slot.fill(EMPTY)
        self._stamp.fill(0)
        self._num_deleted = self._tick = self._head = self._tail = self._num_used = self.num_live = 0
