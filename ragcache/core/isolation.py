"""A model batch that failed, split until each failure is its own text's.

The batcher (``ragcache.core.batching``) gathers concurrent callers' texts into one model call, so one text the
model cannot take (or a batch too big for memory) would fail every request that happened to share its batch.
``encode_isolating`` halves a failed batch and encodes each half again, until what fails fails alone; what it
returns is the batch's vectors, or a vector or a ``RagCacheError`` per text. It knows nothing of the queue.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ragcache.errors import ComputeError, ModelOutOfMemoryError, PartialEncodeError, RagCacheError, UpstreamError

__all__ = ["as_compute_error", "encode_isolating"]


def encode_isolating(encode: Callable[..., torch.Tensor], texts: list[str], prompt: str | None) -> torch.Tensor | list:
    """The batch's vectors (one tensor), or when encoding failed, a vector or an exception per text. A
    failed batch is split in halves and each half encoded again, so a text the model cannot take (or a
    batch too big for memory) fails only the texts that fail alone, not every request that happened to
    share its batch.

    Two failures are not split: a remote model's own failure (``UpstreamError`` that is not ``per_text``:
    down, timed out, garbled), where halving would only send a failing server more calls; and a remote
    model's partial answer (``PartialEncodeError``), whose texts already carry their own outcome."""
    try:
        return encode(texts) if prompt is None else encode(texts, prompt=prompt)
    except PartialEncodeError as exc:
        return _isolate_failed(encode, texts, prompt, exc.outcome)
    except Exception as exc:  # noqa: BLE001 - converted, then handed to the waiting callers
        if len(texts) == 1 or not _is_per_text(exc):
            return [as_compute_error(exc)] * len(texts)
    middle = len(texts) // 2
    return _per_text(encode_isolating(encode, texts[:middle], prompt)) + _per_text(encode_isolating(encode, texts[middle:], prompt))


def _isolate_failed(encode: Callable[..., torch.Tensor], texts: list[str], prompt: str | None, outcome: list) -> list:
    """Keep a partial answer's vectors and errors; encode again, isolating, the texts of failed upstream
    requests that may have failed because of one of their texts (always fewer than ``texts``)."""
    outcome = [as_compute_error(result) if isinstance(result, Exception) else result for result in outcome]
    again = [i for i, result in enumerate(outcome) if isinstance(result, Exception) and _is_per_text(result)]
    if 1 < len(again) < len(texts):
        for i, result in zip(again, _per_text(encode_isolating(encode, [texts[i] for i in again], prompt))):
            outcome[i] = result
    return outcome


def _per_text(outcome: torch.Tensor | list) -> list:
    """A batch outcome as a vector or an exception per text."""
    return list(outcome) if isinstance(outcome, torch.Tensor) else outcome


def _is_per_text(exc: Exception) -> bool:
    """Whether a failure may be caused by one text of the batch (so splitting the batch can isolate it)."""
    return not isinstance(exc, UpstreamError) or exc.per_text


def as_compute_error(exc: Exception) -> RagCacheError:
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
