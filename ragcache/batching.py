"""Single-flight, cross-request batching in front of the model.

Concurrent misses for one key share one computation; misses from concurrent callers are gathered into one
model batch. A worker thread takes whatever is pending the moment the model is free, so batches grow under
load. It waits at most ``max_wait_s`` for a batch to fill, and only while another caller may still join:
given ``calls_in_progress`` (the owner's calls that may reach the model), not when every one of them is
already waiting here, so a lone request (a sequential client, a cold stream) never waits for company.

A result is forgotten here as soon as it is handed out: every repeat is answered by a level of the cache,
counted and inside its budget, never by a memory of this batcher's own. What closes the hand-off window (a
caller that missed L1, then spent milliseconds on L2 and L3, while another caller's computation of the same
key ended): the worker stores a batch's vectors in the first level (``on_computed``) *before* it takes
their keys out of flight, and a caller asking for a key no longer in flight looks in that level once more
(``peek``), under the same lock. A key is thus either still in flight, or already in L1 (unless evicted
since), and a hit found there is reported as an L1 hit, never as a computation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from ragcache.errors import ComputeError, ModelOutOfMemoryError, OverloadedError, PartialEncodeError, RagCacheError, UpstreamError
from ragcache.tiers.base import TierHits

__all__ = ["CALLER_GONE", "ComputeBatcher", "ComputeOutcome"]

log = logging.getLogger(__name__)

# Set, in the thread that calls ``compute``, by a caller that may stop waiting: the service sets it when a
# request is answered 504 at its deadline (ragcache_server/workers.py). The texts of that call which no other
# caller waits for are then taken out of the queue instead of computed for nobody.
CALLER_GONE: ContextVar[threading.Event | None] = ContextVar("ragcache_caller_gone", default=None)
# How often a caller that can go away looks whether it has: the cost of noticing, not of computing.
GONE_POLL_S = 0.05


@dataclass(frozen=True)
class ComputeOutcome:
    """Vectors in the order asked, and the positions answered by ``peek`` (the first level) instead."""

    vectors: torch.Tensor
    peeked: list[int]


@dataclass(eq=False)
class _Item:
    """One text queued for the model, shared by every caller that asked for its key meanwhile."""

    key: str
    text: str
    future: Future = field(default_factory=Future)
    num_waiters: int = 0
    taken: bool = False  # handed to the model: too late to drop


class ComputeBatcher:
    """Batches texts for the model; ``max_pending`` texts may wait at most (beyond: ``OverloadedError``)."""

    def __init__(
        self,
        encode: Callable[[Sequence[str]], torch.Tensor],
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.002,
        max_pending: int = 4096,
        on_computed: Callable[[list[str], torch.Tensor], None] | None = None,
        peek: Callable[[list[str]], TierHits] | None = None,
        calls_in_progress: Callable[[], int] | None = None,
    ):
        self._encode = encode
        self._calls_in_progress = calls_in_progress
        self._num_callers = 0  # callers inside compute_detailed: queued, or waiting for their vectors
        self._on_computed = on_computed
        self._peek = peek
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_pending = max_pending
        self.num_dropped = 0  # texts taken out of the queue because every caller waiting for them had gone
        self.num_refused = 0  # texts refused because the queue was full
        self._pending: list[_Item] = []
        self._in_flight: dict[str, _Item] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="ragcache-compute", daemon=True)
        self._worker.start()

    @property
    def num_pending(self) -> int:
        """Texts queued and not yet handed to the model."""
        return len(self._pending)

    def compute(
        self, keys: Sequence[str], texts: Sequence[str], *, keep: Callable[[list[int], torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        """Vectors for ``texts`` (one per key, in order); see ``compute_detailed``."""
        return self.compute_detailed(keys, texts, keep=keep).vectors

    def compute_detailed(
        self, keys: Sequence[str], texts: Sequence[str], *, keep: Callable[[list[int], torch.Tensor], None] | None = None
    ) -> ComputeOutcome:
        """Vectors for ``texts`` (one per key, in order); blocks until all are computed. When some fail, the
        first failure is raised, after ``keep(positions, vectors)`` was given those that did not: a remote
        model's vectors are paid for, and are cached even when the request that asked for them fails.

        Raises ``OverloadedError`` (queueing nothing) when the queue holds texts and these would take it past
        ``max_pending``; one call larger than that is still taken into an empty queue, so that no request
        the service accepts (``max_batch``) can be refused forever."""
        items: list[_Item] = []
        with self._cond:
            if self._closed:
                raise RagCacheError("the compute batcher is closed")
            peeked = self._peek_first_level(keys)
            num_new = len({key for position, key in enumerate(keys) if key not in self._in_flight and position not in peeked})
            if self._pending and len(self._pending) + num_new > self.max_pending:
                self.num_refused += num_new
                raise OverloadedError(
                    f"the model is busy: {len(self._pending)} texts are queued and {num_new} more would pass the limit of "
                    f"{self.max_pending} (compute_max_pending); retry shortly",
                )
            for position, (key, text) in enumerate(zip(keys, texts)):
                if position in peeked:
                    items.append(peeked[position])
                    continue
                item = self._in_flight.get(key)
                if item is None:
                    item = self._in_flight[key] = _Item(key, text)
                    self._pending.append(item)
                item.num_waiters += 1
                items.append(item)
            if not items:
                return ComputeOutcome(torch.empty(0), [])
            self._num_callers += 1
            self._cond.notify()
        try:
            return ComputeOutcome(torch.stack(self._wait(items, CALLER_GONE.get())), sorted(peeked))
        except Exception:
            # Only those already done: the error is not held back for batches still being computed.
            done = [i for i, item in enumerate(items) if _succeeded(item.future)]
            if keep is not None and done:
                keep(done, torch.stack([items[i].future.result() for i in done]))
            raise
        finally:
            with self._cond:
                self._num_callers -= 1

    def _peek_first_level(self, keys: Sequence[str]) -> dict[int, _Item]:
        """Under the lock: keys not in flight that the first level holds now, as already-answered items."""
        if self._peek is None:
            return {}
        asked = [position for position, key in enumerate(keys) if key not in self._in_flight]
        if not asked:
            return {}
        try:
            hits = self._peek([keys[position] for position in asked])
        except RagCacheError:
            return {}  # the first level failing is a miss here as everywhere
        answered: dict[int, _Item] = {}
        for offset, vector in zip(hits.index, hits.vectors):
            item = _Item(keys[asked[offset]], "", taken=True)
            item.future.set_result(vector)
            answered[asked[offset]] = item
        return answered

    def _wait(self, items: list[_Item], gone: threading.Event | None) -> list[torch.Tensor]:
        if gone is None:
            return [item.future.result() for item in items]
        results = []
        for item in items:
            while True:
                try:
                    results.append(item.future.result(timeout=GONE_POLL_S))
                    break
                except FutureTimeoutError:
                    if gone.is_set():
                        self._leave(items)
                        raise RagCacheError("the caller stopped waiting for these texts") from None
        return results

    def _leave(self, items: list[_Item]) -> None:
        """A caller has gone: texts nobody else waits for, and not yet handed to the model, are dropped."""
        with self._cond:
            for item in items:
                item.num_waiters -= 1
            unwanted = [item for item in items if item.num_waiters == 0 and not item.taken and not item.future.done()]
            if not unwanted:
                return
            dropped = set(unwanted)
            self._pending = [item for item in self._pending if item not in dropped]
            for item in dropped:
                self._in_flight.pop(item.key, None)
                item.future.cancel()
            self.num_dropped += len(dropped)

    def _take_batch(self) -> list[_Item] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None
            if len(self._pending) < self.max_batch and self.max_wait_s > 0 and self._others_may_come():
                self._cond.wait_for(lambda: len(self._pending) >= self.max_batch or not self._others_may_come(),
                                    timeout=self.max_wait_s)
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            for item in batch:
                item.taken = True
            return batch

    def _others_may_come(self) -> bool:
        """Under the lock: whether a call in progress has not reached the queue yet (unknown: assume one has)."""
        return self._calls_in_progress is None or self._calls_in_progress() > self._num_callers

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            if not batch:
                continue  # every text that filled the wait was dropped meanwhile
            try:
                outcome = self._encode_isolating([item.text for item in batch])
            except BaseException as exc:  # noqa: BLE001 - e.g. KeyboardInterrupt: no caller may wait forever
                outcome = [exc] * len(batch)
            self._store_first(batch, outcome)
            for item, result in zip(batch, outcome):
                if isinstance(result, BaseException):
                    item.future.set_exception(result)
                else:
                    item.future.set_result(result)
            with self._cond:
                for item in batch:
                    self._in_flight.pop(item.key, None)

    def _store_first(self, batch: list[_Item], outcome: list) -> None:
        """Hand computed vectors to ``on_computed`` (the first level) while their keys are still in flight."""
        if self._on_computed is None:
            return
        done = [(item.key, result) for item, result in zip(batch, outcome) if not isinstance(result, BaseException)]
        if not done:
            return
        try:
            self._on_computed([key for key, _ in done], torch.stack([vector for _, vector in done]))
        except Exception:  # noqa: BLE001 - a level that fails to store is a later miss, never a lost answer
            log.exception("storing %d computed vectors in the first level failed", len(done))

    def _encode_isolating(self, texts: list[str]) -> list:
        """A vector or an exception per text. A failed batch is split in halves and each half encoded again,
        so a text the model cannot take (or a batch too big for memory) fails only the texts that fail alone,
        not every request that happened to share its batch.

        Two failures are not split: a remote model's own failure (``UpstreamError`` that is not ``per_text``:
        down, timed out, garbled), where halving would only send a failing server more calls; and a remote
        model's partial answer (``PartialEncodeError``), whose texts already carry their own outcome."""
        try:
            return list(self._encode(texts))
        except PartialEncodeError as exc:
            return self._isolate_failed(texts, exc.outcome)
        except Exception as exc:  # noqa: BLE001 - converted, then handed to the waiting callers
            if len(texts) == 1 or not _is_per_text(exc):
                return [_as_compute_error(exc)] * len(texts)
        middle = len(texts) // 2
        return self._encode_isolating(texts[:middle]) + self._encode_isolating(texts[middle:])

    def _isolate_failed(self, texts: list[str], outcome: list) -> list:
        """Keep a partial answer's vectors and errors; encode again, isolating, the texts of failed upstream
        requests that may have failed because of one of their texts (always fewer than ``texts``)."""
        outcome = [_as_compute_error(result) if isinstance(result, Exception) else result for result in outcome]
        again = [i for i, result in enumerate(outcome) if isinstance(result, Exception) and _is_per_text(result)]
        if 1 < len(again) < len(texts):
            for i, result in zip(again, self._encode_isolating([texts[i] for i in again])):
                outcome[i] = result
        return outcome

    def close(self) -> None:
        """Finish what is pending, then stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join(timeout=60)


def _succeeded(future: Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _is_per_text(exc: Exception) -> bool:
    """Whether a failure may be caused by one text of the batch (so splitting the batch can isolate it)."""
    return not isinstance(exc, UpstreamError) or exc.per_text


def _as_compute_error(exc: Exception) -> RagCacheError:
    """The model's failure in the ragcache tree (library errors, e.g. a refused input, pass unchanged)."""
    if isinstance(exc, RagCacheError):
        return exc
    if isinstance(exc, torch.OutOfMemoryError):
        error: RagCacheError = ModelOutOfMemoryError(
            f"the model ran out of memory on this text ({exc}); retry, or send fewer or shorter texts"
        )
    else:
        error = ComputeError(f"the model failed on this text: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
