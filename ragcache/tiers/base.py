"""The one small interface every cache level implements, and the health record the cache keeps for each.

Levels are batched only: ``get_many`` answers a whole batch of keys in one operation (one slab gather, one
Redis round trip, one Milvus query) and ``put_many`` stores a whole batch. Hits come back as positions plus
one stacked tensor rather than a list with ``None`` per key, so no per-key objects are built on the hot path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch

__all__ = ["Tier", "TierHits", "TierHealth"]


@dataclass(frozen=True)
class TierHits:
    """The keys a level found: ``vectors[i]`` is the vector of ``keys[index[i]]``, ``index`` ascending.
    Misses are absent."""

    index: list[int]
    vectors: torch.Tensor

    @classmethod
    def none(cls, dim: int, dtype: torch.dtype) -> "TierHits":
        return cls(index=[], vectors=torch.empty((0, dim), dtype=dtype))


@runtime_checkable
class Tier(Protocol):
    """A cache level. Remote levels raise ``TierUnavailableError`` when they fail; the cache makes it a miss."""

    name: str

    def get_many(self, keys: Sequence[str]) -> TierHits: ...

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None: ...

    def close(self) -> None: ...


@dataclass
class TierHealth:
    """Up/down state of one level, with exponential back-off between retries after a failure.

    Returns from ``record_failure``/``record_success`` say whether the state changed, so the caller logs
    once per outage rather than once per request.
    """

    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    num_failures: int = 0
    retry_at: float = 0.0
    last_error: str | None = None
    _backoff_s: float = field(default=0.0, repr=False)

    @property
    def is_down(self) -> bool:
        return self.num_failures > 0

    def should_try(self) -> bool:
        """True when the level is up, or down but its back-off has passed (a probe)."""
        return not self.is_down or self.clock() >= self.retry_at

    def record_failure(self, error: Exception) -> bool:
        """Note a failure; True when this starts an outage."""
        started = not self.is_down
        self._backoff_s = self.backoff_initial_s if started else min(self._backoff_s * 2, self.backoff_max_s)
        self.num_failures += 1
        self.retry_at = self.clock() + self._backoff_s
        self.last_error = str(error)
        return started

    def record_success(self) -> bool:
        """Note a success; True when this ends an outage."""
        ended = self.is_down
        self.num_failures = 0
        self._backoff_s = 0.0
        return ended
