"""The one small interface every cache level implements, and the health record the cache keeps for each.

Levels are batched only: ``get_many`` answers a whole batch of keys in one operation (one slab gather, one
Redis round trip, one Milvus query) and ``put_many`` stores a whole batch. Hits come back as positions plus
one stacked tensor rather than a list with ``None`` per key, so no per-key objects are built on the hot path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Tier", "TierHits", "TierHealth"]


@dataclass(frozen=True)
class TierHits:
    """The keys a level found: ``vectors[i]`` is the vector of ``keys[index[i]]``, ``index`` ascending.
    Misses are absent."""

    index: list[int]
    vectors: torch.Tensor

    @classmethod
    def none(cls, dim: int, dtype: torch.dtype) -> TierHits:
        return cls(index=[], vectors=torch.empty((0, dim), dtype=dtype))


@runtime_checkable
class Tier(Protocol):
    """A cache level. Remote levels raise ``TierUnavailableError`` when they fail; the cache makes it a miss.

    A level every process of a fleet sees (Redis, a Milvus server) says so with ``shared = True``: the first
    such level below L1 is where single flight across processes publishes vectors (``ragcache.tiers.levels``).
    """

    name: str

    def get_many(self, keys: Sequence[str]) -> TierHits: ...

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None: ...

    def close(self) -> None: ...


@dataclass
class TierHealth:
    """Up/down state of one level (a circuit breaker), with exponential back-off between probes.

    The circuit opens on the first failure: from then on the level is skipped, and once per back-off one
    caller (and only one, however many threads ask at once) is let through as a probe. A failed probe
    doubles the back-off up to ``backoff_max_s``; a successful one closes the circuit. The cap is short
    because the levels are caches: a probe costs one request at most one store timeout, while a long cap
    would keep a restarted Redis or Milvus unused for that long.

    Returns from ``record_failure``/``record_success`` say whether the state changed, so the caller logs
    once per outage rather than once per request.
    """

    backoff_initial_s: float = 0.5
    backoff_max_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    num_failures: int = 0
    num_outages: int = 0
    retry_at: float = 0.0
    down_since: float | None = None  # clock() when the current outage started
    last_error: str | None = None
    _backoff_s: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def is_down(self) -> bool:
        return self.num_failures > 0

    def down_for_s(self) -> float | None:
        """Seconds since the current outage began (None while up)."""
        since = self.down_since
        return None if since is None else round(self.clock() - since, 3)

    def may_try(self) -> bool:
        """Whether a call would be let through now (up, or the back-off has run out), without claiming the
        probe: for a scheduler that picks what is due before it tries it (the prefix registry's warm loop)."""
        return not self.is_down or self.clock() >= self.retry_at

    def should_try(self) -> bool:
        """True when the level is up, or down with its back-off passed: then this caller is the one probe,
        and the others keep skipping the level until the probe's outcome is recorded (or one more back-off)."""
        if not self.is_down:
            return True
        with self._lock:
            now = self.clock()
            if now < self.retry_at:
                return False
            self.retry_at = now + self._backoff_s
            return True

    def record_failure(self, error: Exception) -> bool:
        """Note a failure; True when this starts an outage."""
        with self._lock:
            started = not self.is_down
            self._backoff_s = self.backoff_initial_s if started else min(self._backoff_s * 2, self.backoff_max_s)
            self.num_failures += 1
            now = self.clock()
            self.retry_at = now + self._backoff_s
            if started:
                self.num_outages += 1
                self.down_since = now
            self.last_error = str(error)
            return started

    def record_success(self) -> bool:
        """Note a success; True when this ends an outage."""
        if not self.is_down:  # the hot path: no lock while the level is healthy
            return False
        with self._lock:
            ended = self.is_down
            self.num_failures = 0
            self._backoff_s = 0.0
            self.down_since = None
            return ended
