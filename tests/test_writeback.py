"""WriteBehind: every accepted write is stored, also one submitted while ``close`` runs."""

from __future__ import annotations

import queue
import threading

import torch

from ragcache.writeback import WriteBehind


class CloseDuringPut(queue.Queue):
    """A queue that, on the first write put into it, has another thread call ``close`` and gives it a moment
    to finish before the write goes in: the interleaving where a submit saw the writer open, then close ran."""

    def __init__(self):
        super().__init__()
        self.writer: WriteBehind | None = None
        self.closer: threading.Thread | None = None

    def put(self, item, block=True, timeout=None):
        if item is not None and self.closer is None:
            self.closer = threading.Thread(target=self.writer.close)
            self.closer.start()
            self.closer.join(timeout=1.0)  # done in time without the lock; blocked on it with the lock
        super().put(item, block, timeout)


def test_a_write_submitted_while_close_runs_is_stored_and_flush_returns():
    stored = []
    pending = CloseDuringPut()
    writer = WriteBehind(lambda level, keys, vectors: stored.append(list(keys)), pending=pending)
    pending.writer = writer
    writer.submit(1, ["racing"], torch.zeros(1, 4))
    pending.closer.join(timeout=30)
    assert not pending.closer.is_alive()
    flushed = threading.Thread(target=writer.flush, daemon=True)
    flushed.start()
    flushed.join(timeout=30)
    assert not flushed.is_alive(), "flush() hung: a write was queued behind the stop and never stored"
    assert stored == [["racing"]]


def test_after_close_a_write_goes_through_at_once():
    stored = []
    writer = WriteBehind(lambda level, keys, vectors: stored.append((level, list(keys))))
    writer.submit(1, ["queued"], torch.zeros(1, 4))
    writer.close()
    writer.submit(2, ["through"], torch.zeros(1, 4))
    assert stored == [(1, ["queued"]), (2, ["through"])]
