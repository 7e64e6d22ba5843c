"""The one breaker: the up/down state of anything remote the library calls (a cache level, a remote model, a
reranker, a vLLM endpoint), so a dead or hung dependency costs one deadline and then is skipped until a probe
finds it back. Torch-free: the HTTP client's imports reach it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PROBE_TEXT", "TierHealth", "probe_levels"]

# The text whose key probes a cache's levels (``probe_levels``): looked up, never embedded or stored.
PROBE_TEXT = "\x00ragcache level probe"


def probe_levels(cache: Any) -> None:
    """Probe every level of ``cache`` (an ``EmbeddingCache``) now: each is asked for the key of a text nobody embeds,
    whatever its breaker says, and the outcome becomes its state (``Levels.probe``)."""
    cache.levels.probe(cache.space.keys([PROBE_TEXT]))


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
    probed_at: float | None = None  # clock() of the last probe (record_probe): what /health's state is as of
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

    def probed_s_ago(self) -> float | None:
        """Seconds since the last probe (None: never probed)."""
        probed = self.probed_at
        return None if probed is None else round(self.clock() - probed, 3)

    def record_probe(self, error: Exception | None) -> bool:
        """Note the outcome of a probe, a call made to learn the state rather than for a caller (None: it worked);
        True when the state changed."""
        self.probed_at = self.clock()
        return self.record_success() if error is None else self.record_failure(error)

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
