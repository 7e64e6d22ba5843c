"""Write-behind for the remote levels: callers return as soon as L1 holds a vector, while one worker thread
stores it in Redis and Milvus. ``flush`` waits until everything accepted has been written; ``close``
flushes, then stops. The queue is bounded: when it is full, ``submit`` blocks (back-pressure), so no write
is ever dropped for lack of room. A write submitted while ``close`` runs is either queued ahead of the stop
or written through by the caller: the check for "closed" and the put are one step under a lock (apart, a
write could land behind the stop, never be stored, and leave ``flush`` waiting for it forever).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence

import torch

__all__ = ["WriteBehind"]

log = logging.getLogger(__name__)

Write = tuple[int, Sequence[str], torch.Tensor]


class WriteBehind:
    def __init__(
        self,
        store: Callable[[int, Sequence[str], torch.Tensor], None],
        *,
        max_pending: int = 1024,
        pending: queue.Queue | None = None,  # the queue of accepted writes (tests pass one that interleaves)
    ):
        self._store = store
        self._queue: queue.Queue[Write | None] = pending if pending is not None else queue.Queue(maxsize=max_pending)
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
        while (item := self._queue.get()) is not None:
            try:
                self._store(*item)
            except Exception:  # noqa: BLE001 - the worker must outlive any one bad write
                log.exception("write-behind: a write to level %d failed", item[0])
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def flush(self) -> None:
        """Block until every write accepted so far has been stored (or has failed and been counted)."""
        self._queue.join()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._worker.join()
