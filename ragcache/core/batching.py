"""Single-flight, cross-request batching in front of the model.

Concurrent misses for one key share one computation; misses from concurrent callers are gathered into one
model batch. A worker thread takes whatever is pending the moment the model is free, so batches grow under
load. It waits at most ``max_wait_s`` for a batch to fill, and only while another caller may still join:
given ``calls`` (the owner's ``CallsInProgress``, calls that may reach the model), not when every one of them
is already waiting here, so a lone request (a sequential client, a cold stream) never waits for company.

A result is forgotten here as soon as it is handed out: every repeat is answered by a level of the cache,
counted and inside its budget, never by a memory of this batcher's own. What closes the hand-off window (a
caller that missed L1, then spent milliseconds on L2 and L3, while another caller's computation of the same
key ended): given the cache's ``Levels``, the worker stores a batch's vectors in the first level *before* it
takes their keys out of flight, and a caller asking for a key no longer in flight looks in that level once
more, under the same lock. A key is thus either still in flight, or already in L1 (unless evicted since),
and a hit found there is reported as an L1 hit, never as a computation.

Texts under different prompts (``ragcache.core.scope``) wait in one queue; a batch holds one prompt's texts
(the first waiting text's), handed to ``encode(texts, prompt=...)``; texts without one go to ``encode(texts)``.

A batch that fails is split until each failure is its own text's (``ragcache.core.isolation``).

Calls flow down only: the batcher is given the levels and the counter of calls, and hands what it computed
back as a ``ComputeOutcome`` (a failure included), never through a callback into its owner.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ragcache.core.isolation import encode_isolating
from ragcache.core.keys import KeyList
from ragcache.errors import OverloadedError, RagCacheError

if TYPE_CHECKING:
    from ragcache.core.levels import Levels

__all__ = ["CALLER_GONE", "CallsInProgress", "ComputeBatcher", "ComputeOutcome"]

log = logging.getLogger(__name__)

# Set, in the thread that calls ``compute``, by a caller that may stop waiting: the service sets it when a
# request is answered 504 at its deadline (ragcache_server/workers.py). The texts of that call which no other
# caller waits for are then taken out of the queue instead of computed for nobody.
CALLER_GONE: ContextVar[threading.Event | None] = ContextVar("ragcache_caller_gone", default=None)
# How often a caller that can go away looks whether it has: the cost of noticing, not of computing.
GONE_POLL_S = 0.05


class CallsInProgress:
    """How many of the owner's calls are under way and may still reach the model (``with calls:`` around each):
    the batcher waits for company only while one of them has not reached it yet."""

    def __init__(self) -> None:
        self._num = 0
        self._lock = threading.Lock()

    @property
    def num(self) -> int:
        return self._num

    def __enter__(self) -> CallsInProgress:
        with self._lock:
            self._num += 1
        return self

    def __exit__(self, *exc_info) -> None:
        with self._lock:
            self._num -= 1


@dataclass(frozen=True)
class ComputeOutcome:
    """Vectors in the order asked, and the positions the first level answered instead (``peeked``).

    When some texts failed, ``failure`` is the first failure in the caller's order, and ``vectors`` hold only
    the positions at ``done``, those that did not fail: a remote model's vectors are paid for, and are cached
    even when the request that asked for them fails."""

    vectors: torch.Tensor
    peeked: list[int]
    failure: BaseException | None = None
    done: list[int] | None = None  # with a failure: the positions of ``vectors``


@dataclass(eq=False, slots=True)
class _Item:
    """One text queued for the model, shared by every caller that asked for its key meanwhile.

    Its outcome is a row of a whole batch's vectors (``vectors[row]``), never a tensor of its own: a batch is
    answered with one tensor, and each caller gathers its rows with one ``index_select`` per batch. No
    synchronisation object per text either: each caller waits on a condition of its own (on the batcher's one lock),
    listed in ``waiters`` of every item it waits for, so that a batch's end wakes only its callers."""

    key: str
    text: str
    prompt: str | None = None
    num_waiters: int = 0
    waiters: list[threading.Condition] = field(default_factory=list)
    taken: bool = False  # handed to the model: too late to drop
    done: bool = False
    vectors: torch.Tensor | None = None
    row: int = 0
    error: BaseException | None = None


class ComputeBatcher:
    """Batches texts for the model; ``max_pending`` texts may wait at most (beyond: ``OverloadedError``)."""

    def __init__(
        self,
        encode: Callable[..., torch.Tensor],
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.002,
        max_pending: int = 4096,
        levels: Levels | None = None,
        calls: CallsInProgress | None = None,
    ):
        self._encode = encode
        self._calls = calls
        self._num_callers = 0  # callers inside compute_detailed: queued, or waiting for their vectors
        # Computed vectors go to the first level, and a key no longer in flight is looked for there (None: no levels).
        self._levels = levels if levels is not None and len(levels) else None
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_pending = max_pending
        self.num_dropped = 0  # texts taken out of the queue because every caller waiting for them had gone
        self.num_refused = 0  # texts refused because the queue was full
        self._pending: list[_Item] = []
        self._in_flight: dict[str, _Item] = {}
        # One lock: the worker waits on ``_cond`` for texts, each caller on a condition of its own for its outcomes
        # (``_Item.waiters``), so a caller's notify always reaches the worker, and a batch's end wakes only the
        # callers of its texts (one condition for all of them woke every waiting caller at each batch's end).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="ragcache-compute", daemon=True)
        self._worker.start()

    @property
    def num_pending(self) -> int:
        """Texts queued and not yet handed to the model."""
        return len(self._pending)

    def compute(self, keys: Sequence[str], texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:
        """Vectors for ``texts`` (one per key, in order); the first failure is raised (``compute_detailed``)."""
        outcome = self.compute_detailed(keys, texts, prompt=prompt)
        if outcome.failure is not None:
            raise outcome.failure
        return outcome.vectors

    def compute_detailed(self, keys: Sequence[str], texts: Sequence[str], *, prompt: str | None = None) -> ComputeOutcome:
        """Vectors for ``texts`` under ``prompt`` (one per key, in order; a key names its prompt, the space's);
        blocks until all are computed or one has failed (the outcome's ``failure``, with the vectors of the
        texts already done at ``done``).

        Raises ``OverloadedError`` (queueing nothing) when the queue holds texts and these would take it past
        ``max_pending``; one call larger than that is still taken into an empty queue, so that no request
        the service accepts (``max_batch``) can be refused forever."""
        items: list[_Item] = []
        waiter = threading.Condition(self._lock)
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
                    item = self._in_flight[key] = _Item(key, text, prompt)
                    self._pending.append(item)
                item.num_waiters += 1
                item.waiters.append(waiter)
                items.append(item)
            if not items:
                return ComputeOutcome(torch.empty(0), [])
            self._num_callers += 1
            self._cond.notify()
        try:
            failure = self._wait(items, waiter, CALLER_GONE.get())
            if failure is None:
                return ComputeOutcome(_gather(items), sorted(peeked))
            # Only those already done: the error is not held back for batches still being computed.
            done = [i for i, item in enumerate(items) if item.done and item.error is None]
            vectors = _gather([items[i] for i in done]) if done else torch.empty(0)
            return ComputeOutcome(vectors, sorted(peeked), failure=failure, done=done)
        finally:
            with self._cond:
                self._num_callers -= 1

    def _peek_first_level(self, keys: Sequence[str]) -> dict[int, _Item]:
        """Under the lock: keys not in flight that the first level holds now, as already-answered items."""
        if self._levels is None:
            return {}
        asked = [position for position, key in enumerate(keys) if key not in self._in_flight]
        if not asked:
            return {}
        try:
            # Uncounted: the walk counted these keys' miss already.
            hits = self._levels.first.get_many(keys.take(asked) if isinstance(keys, KeyList) else [keys[position] for position in asked])
        except RagCacheError:
            return {}  # the first level failing is a miss here as everywhere
        answered: dict[int, _Item] = {}
        for row, offset in enumerate(hits.index):
            answered[asked[offset]] = _Item(keys[asked[offset]], "", taken=True, done=True, vectors=hits.vectors, row=row)
        return answered

    def _wait(self, items: list[_Item], waiter: threading.Condition, gone: threading.Event | None) -> BaseException | None:
        """Until every item is done, or one has failed (returned: the first failure in the caller's order), woken
        through ``waiter``; a caller that can go away looks every ``GONE_POLL_S`` whether it has."""
        with waiter:
            while True:
                pending = False
                for item in items:
                    if not item.done:  # its outcome may be half written until the batch is settled
                        pending = True
                    elif item.error is not None:
                        return item.error
                if not pending:
                    return None
                if gone is not None and gone.is_set():
                    self._leave(items)
                    raise RagCacheError("the caller stopped waiting for these texts")
                waiter.wait(GONE_POLL_S if gone is not None else None)

    def _leave(self, items: list[_Item]) -> None:
        """Under the lock: a caller has gone; texts nobody else waits for, not yet handed to the model, are dropped."""
        for item in items:
            item.num_waiters -= 1
        unwanted = [item for item in items if item.num_waiters == 0 and not item.taken and not item.done]
        if not unwanted:
            return
        dropped = set(unwanted)
        self._pending = [item for item in self._pending if item not in dropped]
        for item in dropped:
            self._in_flight.pop(item.key, None)
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
            if not self._pending:
                return []
            batch, self._pending = _one_prompt(self._pending, self.max_batch)
            for item in batch:
                item.taken = True
            return batch

    def _others_may_come(self) -> bool:
        """Under the lock: whether a call in progress has not reached the queue yet (unknown: assume one has)."""
        return self._calls is None or self._calls.num > self._num_callers

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            if not batch:
                continue  # every text that filled the wait was dropped meanwhile
            try:
                outcome = encode_isolating(self._encode, [item.text for item in batch], batch[0].prompt)
            except BaseException as exc:  # noqa: BLE001 - e.g. KeyboardInterrupt: no caller may wait forever
                outcome = [exc] * len(batch)
            self._settle(batch, outcome)

    def _settle(self, batch: list[_Item], outcome: torch.Tensor | list) -> None:
        """Give each item its outcome; the vectors reach the first level while their keys are still in flight,
        and the keys leave the flight with their items done, under one lock."""
        stored: torch.Tensor | None = None
        if isinstance(outcome, torch.Tensor):
            for row, item in enumerate(batch):
                item.vectors, item.row = outcome, row
            stored_keys, stored = [item.key for item in batch], outcome
        else:
            rows = []
            for item, result in zip(batch, outcome):
                if isinstance(result, BaseException):
                    item.error = result
                else:
                    item.vectors = result.unsqueeze(0)
                    rows.append(item.vectors)
            stored_keys = [item.key for item in batch if item.error is None]
            stored = torch.cat(rows) if rows else None
        if self._levels is not None and stored is not None:
            try:
                self._levels.store(0, stored_keys, stored)
            except Exception:  # noqa: BLE001 - a level that fails to store is a later miss, never a lost answer
                log.exception("storing %d computed vectors in the first level failed", len(stored_keys))
        with self._lock:
            waiters: dict[int, threading.Condition] = {}
            for item in batch:
                item.done = True
                self._in_flight.pop(item.key, None)
                for waiter in item.waiters:
                    waiters[id(waiter)] = waiter
            for waiter in waiters.values():
                waiter.notify()

    def close(self) -> None:
        """Finish what is pending, then stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join(timeout=60)


def _one_prompt(pending: list[_Item], max_batch: int) -> tuple[list[_Item], list[_Item]]:
    """A batch of at most ``max_batch`` of the pending texts under the first one's prompt, in queue order, and
    the texts left waiting. The common case, one prompt throughout, is a slice."""
    prompt = pending[0].prompt
    if all(item.prompt == prompt for item in pending[:max_batch]):
        return pending[:max_batch], pending[max_batch:]
    batch: list[_Item] = []
    rest: list[_Item] = []
    for item in pending:
        (batch if item.prompt == prompt and len(batch) < max_batch else rest).append(item)
    return batch, rest


def _gather(items: list[_Item]) -> torch.Tensor:
    """The items' vectors stacked in order: one ``index_select`` per batch they came from."""
    sources: dict[int, tuple[torch.Tensor, list[int], list[int]]] = {}
    for position, item in enumerate(items):
        assert item.vectors is not None  # done without an error
        source = sources.setdefault(id(item.vectors), (item.vectors, [], []))
        source[1].append(position)
        source[2].append(item.row)
    if len(sources) == 1:
        vectors, _, rows = next(iter(sources.values()))
        return vectors.index_select(0, torch.tensor(rows, device=vectors.device))
    first = next(iter(sources.values()))[0]
    dtype = first.dtype
    for vectors, _, _ in sources.values():
        dtype = torch.promote_types(dtype, vectors.dtype)
    gathered = torch.empty((len(items), first.shape[1]), dtype=dtype, device=first.device)
    for vectors, positions, rows in sources.values():
        gathered[torch.tensor(positions, device=first.device)] = vectors.index_select(
            0, torch.tensor(rows, device=vectors.device)).to(gathered.device, dtype)
    return gathered
