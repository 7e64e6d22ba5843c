"""Single-flight, cross-request batching in front of the model.

Concurrent misses for one key share one computation; misses from concurrent callers are gathered into one
model batch. A worker thread takes whatever is pending the moment the model is free (waiting at most
``max_wait_s`` for a batch to fill), so batches grow under load and cost no added latency when idle.

A result is forgotten here as soon as it is handed out: every repeat is answered by a level of the cache,
counted and inside its budget, never by a memory of this batcher's own. A caller that missed L1 in the
moment between another caller's computation ending and its write into L1 computes the text again: a rare,
honest, counted recomputation rather than a hidden level.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import torch

from ragcache.errors import ComputeError, ModelOutOfMemoryError, PartialEncodeError, RagCacheError, UpstreamError

__all__ = ["ComputeBatcher"]


class ComputeBatcher:
    def __init__(
        self,
        encode: Callable[[Sequence[str]], torch.Tensor],
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.002,
    ):
        self._encode = encode
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._pending: list[tuple[str, str, Future]] = []
        self._in_flight: dict[str, Future] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="ragcache-compute", daemon=True)
        self._worker.start()

    def compute(
        self, keys: Sequence[str], texts: Sequence[str], *, keep: Callable[[list[int], torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        """Vectors for ``texts`` (one per key, in order); blocks until all are computed. When some fail, the
        first failure is raised, after ``keep(positions, vectors)`` was given those that did not: a remote
        model's vectors are paid for, and are cached even when the request that asked for them fails."""
        futures: list[Future] = []
        with self._cond:
            if self._closed:
                raise RagCacheError("the compute batcher is closed")
            for key, text in zip(keys, texts):
                future = self._in_flight.get(key)
                if future is None:
                    future = Future()
                    self._in_flight[key] = future
                    self._pending.append((key, text, future))
                futures.append(future)
            self._cond.notify()
        if not futures:
            return torch.empty(0)
        try:
            return torch.stack([future.result() for future in futures])
        except Exception:
            # Only those already done: the error is not held back for batches still being computed.
            done = [i for i, future in enumerate(futures) if future.done() and future.exception() is None]
            if keep is not None and done:
                keep(done, torch.stack([futures[i].result() for i in done]))
            raise

    def _take_batch(self) -> list[tuple[str, str, Future]] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None
            if len(self._pending) < self.max_batch and self.max_wait_s > 0:
                self._cond.wait_for(lambda: len(self._pending) >= self.max_batch, timeout=self.max_wait_s)
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            return batch

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            try:
                outcome = self._encode_isolating([text for _, text, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - e.g. KeyboardInterrupt: no caller may wait forever
                outcome = [exc] * len(batch)
            for (_, _, future), result in zip(batch, outcome):
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            with self._cond:
                for key, _, _ in batch:
                    self._in_flight.pop(key, None)

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
