"""WriteBehind: every accepted write is stored, also one submitted while ``close`` runs."""

from __future__ import annotations

import queue
import threading

import torch

from ragcache.core.writeback import WriteBehind


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


def test_writes_waiting_together_are_stored_as_one_write_per_level_latest_row_winning():
    stored = []
    busy, release = threading.Event(), threading.Event()

    def store(level, keys, vectors):
        if keys == ["first"]:
            busy.set()
            release.wait(timeout=30)  # the worker is busy while the next writes queue up behind it
        stored.append((level, list(keys), vectors[:, 0].tolist()))

    writer = WriteBehind(store)
    writer.submit(1, ["first"], torch.zeros(1, 4))
    assert busy.wait(timeout=30)
    writer.submit(1, ["a", "b"], torch.tensor([[1.0] * 4, [2.0] * 4]))
    writer.submit(2, ["a"], torch.full((1, 4), 3.0))
    writer.submit(1, ["b", "c"], torch.tensor([[4.0] * 4, [5.0] * 4]))
    release.set()
    writer.flush()
    writer.close()
    assert stored == [
        (1, ["first"], [0.0]),
        # one call for level 1: "b" once, with its later vector, in the position of its later write
        (1, ["a", "b", "c"], [1.0, 4.0, 5.0]),
        (2, ["a"], [3.0]),
    ]
    assert writer.num_pending == 0


def test_a_lingering_writer_gathers_writes_into_one_call_and_flush_ends_the_linger():
    stored = []
    # An hour's linger: without flush ending it, the test would hang (and fail at its join timeout).
    writer = WriteBehind(lambda level, keys, vectors: stored.append(list(keys)), linger_s=3600)
    for key in ("a", "b", "c"):
        writer.submit(2, [key], torch.zeros(1, 4))
    assert stored == [] and writer.num_pending == 3  # gathered, not yet stored
    flushed = threading.Thread(target=writer.flush, daemon=True)
    flushed.start()
    flushed.join(timeout=30)
    assert not flushed.is_alive() and stored == [["a", "b", "c"]]
    writer.submit(2, ["d"], torch.zeros(1, 4))
    writer.close()  # close ends a linger too, storing what was gathered
    assert stored == [["a", "b", "c"], ["d"]] and writer.num_pending == 0
