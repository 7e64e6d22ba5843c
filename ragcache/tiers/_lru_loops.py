"""The Python twin of ``_lru_kernels.c``: the L1 key map's per-request loops in numpy batch operations, with the C
module's signatures and results (``ragcache.observe.compiled`` chooses one at import; tests run both). Arrays in,
results written in place, as there."""

from __future__ import annotations

import numpy as np

__all__ = ["find", "find_hits", "touch"]

EMPTY = -1


def find(keys: np.ndarray, hi: np.ndarray, lo: np.ndarray, slot_row: np.ndarray, mask: int, rows_out: np.ndarray, /) -> None:
    """rows_out[i] = the row of keys[i], or -1 where it is not resident."""
    rows_out[: len(keys)] = _probe(keys, hi, lo, slot_row, mask)


def find_hits(keys: np.ndarray, hi: np.ndarray, lo: np.ndarray, slot_row: np.ndarray, mask: int, positions_out: np.ndarray,
              rows_out: np.ndarray, /) -> int:
    """The resident keys only: their positions in keys and their rows, in order, first in the outputs; how many."""
    rows = _probe(keys, hi, lo, slot_row, mask)
    positions = np.flatnonzero(rows >= 0)
    positions_out[: len(positions)] = positions
    rows_out[: len(positions)] = rows[positions]
    return len(positions)


def _probe(keys: np.ndarray, hi: np.ndarray, lo: np.ndarray, slot_row: np.ndarray, mask: int) -> np.ndarray:
    """Open addressing with linear probing: a slot's row is >= 0 for a key, -1 empty (the probe ends), -2 a
    tombstone (the probe goes on)."""
    keys = keys.reshape(-1, 2)
    rows = np.full(len(keys), EMPTY, dtype=np.int64)
    slots = (keys[:, 1] & np.uint64(mask)).astype(np.int64)
    # The first round over the whole batch (most keys end there), without indexing by ``pending``.
    row = slot_row[slots]
    hit = (row >= 0) & (lo[slots] == keys[:, 1]) & (hi[slots] == keys[:, 0])
    rows[hit] = row[hit]
    pending = np.flatnonzero(~hit & (row != EMPTY))
    slots[pending] = (slots[pending] + 1) & mask
    while len(pending):
        at = slots[pending]
        row = slot_row[at]
        hit = (row >= 0) & (lo[at] == keys[pending, 1]) & (hi[at] == keys[pending, 0])
        rows[pending[hit]] = row[hit]
        # Past a slot of another key or a tombstone the probe goes on; an empty slot ends it.
        pending = pending[~hit & (row != EMPTY)]
        slots[pending] = (slots[pending] + 1) & mask
    return rows


def touch(rows: np.ndarray, stamp: np.ndarray, log_rows: np.ndarray, log_ticks: np.ndarray, tail: int, tick: int, /) -> None:
    """Rows used in order: each stamped with the next tick and logged at tail onwards (a row used twice keeps its
    later tick; its earlier entry is stale). The caller moves tail and tick on by len(rows) and makes room first."""
    count = len(rows)
    if tail < 0 or count > len(log_rows) - tail or tick < 0:
        raise ValueError("lru loops: rows int64, a log of int32 rows and int64 ticks with room for them at tail")
    if count and (rows.min() < 0 or rows.max() >= len(stamp)):
        raise ValueError("lru loops: a row that is not a row of this index")
    ticks = np.arange(tick + 1, tick + 1 + count, dtype=np.int64)
    log_rows[tail : tail + count] = rows
    log_ticks[tail : tail + count] = ticks
    if len(np.unique(rows)) == count:
        stamp[rows] = ticks
    else:  # numpy's order for a repeated index is not promised: each row's last use, written once
        last = count - 1 - np.unique(rows[::-1], return_index=True)[1]
        stamp[rows[last]] = ticks[last]
