"""Write-behind for a remote level: callers return as soon as L1 holds a vector, while a worker thread stores
it in the level (the cache runs one per level: a slow Milvus never holds back Redis' writes). ``linger_s``
lets the worker gather writes for that long after the first before storing them in one call: a level that
costs far more per call than per row (Milvus) then takes one call, and its client's CPU, where it took
several, each of which competed with requests for the cores and the GIL. ``flush`` waits until everything
accepted has been written (ending a linger at once); ``close`` flushes, then stops. The queue is bounded:
when it is full, ``submit`` blocks (back-pressure), so no write is ever dropped for lack of room. A write
submitted while ``close`` runs is either queued ahead of the stop or written through by the caller: the
check for "closed" and the put are one step under a lock (apart, a write could land behind the stop, never
be stored, and leave ``flush`` waiting for it forever).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import torch

__all__ = ["WriteBehind"]

log = logging.getLogger(__name__)

Write = tuple[int, Sequence[str], torch.Tensor]
# Put by ``flush``: the worker stores what it has gathered without lingering further.
_FLUSH = object()


class WriteBehind:
    def __init__(
        self,
        store: Callable[[int, Sequence[str], torch.Tensor], None],
        *,
        max_pending: int = 1024,
        max_coalesced: int = 64,
        linger_s: float = 0.0,
        pending: queue.Queue | None = None,  # the queue of accepted writes (tests pass one that interleaves)
    ):
        self._store = store
        self._queue: queue.Queue = pending if pending is not None else queue.Queue(maxsize=max_pending)
        self._max_coalesced = max_coalesced
        self._linger_s = linger_s
        self._closed = False
        self._lock = threading.Lock()  # "closed" and the put into the queue change together
        self._worker = threading.Thread(target=self._run, name="ragcache-write-behind", daemon=True)
        self._worker.start()

    def submit(self, level: int, keys: Sequence[str], vectors: torch.Tensor) -> None:
        # A full queue blocks the put under the lock: close then waits its turn, and the worker (which never
        # takes the lock) drains the queue meanwhile.
        with self._lock:
            if not self._closed:
                self._queue.put((level, keys, vectors))
                return
        self._store(level, keys, vectors)  # after close, write through rather than lose it

    @property
    def num_pending(self) -> int:
        return self._queue.unfinished_tasks

    def _run(self) -> None:
        closing = False
        while not closing:
            batch = [self._queue.get()]
            # Coalesce what else is waiting, or arrives within the linger, into one write per level.
            deadline = time.monotonic() + self._linger_s
            while batch[-1] is not None and batch[-1] is not _FLUSH and len(batch) < self._max_coalesced:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            closing = batch[-1] is None
            writes = [item for item in batch if item is not None and item is not _FLUSH]
            for level, keys, vectors in _per_level(writes):
                try:
                    self._store(level, keys, vectors)
                except Exception:  # noqa: BLE001 - the worker must outlive any one bad write
                    log.exception("write-behind: a write of %d vectors to level %d failed", len(keys), level)
            for _ in batch:
                self._queue.task_done()

    def flush(self) -> None:
        """Block until every write accepted so far has been stored (or has failed and been counted)."""
        with self._lock:
            if self._closed:
                return  # close stored everything, and no worker is left to answer a marker
            if self._linger_s:
                self._queue.put(_FLUSH)
        self._queue.join()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._worker.join()


def _per_level(writes: list[Write]) -> list[Write]:
    """The writes merged into one per level, levels in order of first appearance, rows in order of arrival
    (a later write of a key lands after an earlier one, as it would have written separately)."""
    by_level: dict[int, list[Write]] = {}
    for write in writes:
        by_level.setdefault(write[0], []).append(write)
    merged: list[Write] = []
    for level, group in by_level.items():
        if len(group) == 1:
            merged.append(group[0])
            continue
        keys = [key for _, group_keys, _ in group for key in group_keys]
        vectors = torch.cat([group_vectors.to(group[0][2].device) for _, _, group_vectors in group])
        last = {key: position for position, key in enumerate(keys)}
        if len(last) != len(keys):  # one row per key (a store may refuse repeats), the latest write winning
            positions = sorted(last.values())
            keys, vectors = [keys[p] for p in positions], vectors[positions]
        merged.append((level, keys, vectors))
    return merged
