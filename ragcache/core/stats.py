"""Hit-rate statistics: per level lookups, hits, misses, errors and latency, since start and recently; per request,
overall and per scope (a tenant, a named prompt), what a cache's callers saw (``RequestAccounts``).

Counters are totals since start; latency percentiles and the recent window come from a bounded log of the
latest events, so memory stays constant however long the process runs.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # for the annotations only: levels.py imports this module, and the cache hands its parts in
    from ragcache.core.encoder import Encoder
    from ragcache.core.keys import EmbeddingSpace
    from ragcache.core.levels import Levels
    from ragcache.core.scope import Scope

__all__ = ["LATENCY_BUCKETS_S", "MISS_CAUSES", "CacheStats", "LatencyHistogram", "LevelRecorder", "LevelStats", "RequestAccounts",
           "ScopeRecorders", "ScopeStats"]

# Why a level did not hold a key it was asked for (ragcache.core.causes explains each); every miss has one.
MISS_CAUSES = ("never_seen", "evicted", "expired", "drift", "bypassed", "unavailable")

# Upper bounds (seconds) of the latency histogram buckets, as Prometheus "le" labels: from an L1 gather
# (tens of microseconds) to a model call on a large batch (seconds). Fixed, so that histograms from many
# replicas add up bucket by bucket (histogram_quantile over sum by (le)).
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class LevelStats:
    """One level's figures. ``lookups = hits + misses``; ``errors`` counts keys asked while the level failed;
    ``misses_by_cause`` splits the misses of the cache's requests by ``MISS_CAUSES`` (a key found by a later
    pass of the same request, a lookup outside the walk, is not explained, so the sum may fall short of it)."""

    level: str
    lookups: int
    hits: int
    misses: int
    errors: int
    hit_rate: float
    latency_mean_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    misses_by_cause: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheStats:
    """The cache's figures for one embedding space, over one period (since start, or the recent window)."""

    space_id: str
    model: str
    period: str
    period_s: float
    requests: int
    texts: int
    hits: int
    hit_rate: float  # texts served by any level / texts asked for
    texts_computed: int
    compute_s: float
    compute_s_saved: float  # hits x the measured mean compute time of one text
    levels: tuple[LevelStats, ...]


@dataclass(frozen=True)
class LatencyHistogram:
    """Batch lookup latencies since start: ``counts[i]`` calls took at most ``LATENCY_BUCKETS_S[i]`` seconds
    (cumulative, as Prometheus counts buckets); ``num_calls`` includes those over the last bound."""

    bounds_s: tuple[float, ...]
    counts: tuple[int, ...]
    num_calls: int
    sum_s: float


class LevelRecorder:
    """Thread-safe accumulator for one level (or for the whole cache)."""

    def __init__(self, level: str, *, window_s: float = 300.0, max_events: int = 8192, clock: Callable[[], float] = time.monotonic):
        self.level = level
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._totals = np.zeros(3, dtype=np.int64)  # hits, misses, errors
        self._latency_sum_s = 0.0
        self._num_calls = 0
        self._bucket_counts = np.zeros(len(LATENCY_BUCKETS_S), dtype=np.int64)  # per bucket, not cumulative
        # (time, hits, misses, errors, latency_s) of the latest calls: percentiles and the recent window.
        self._events: deque[tuple[float, int, int, int, float]] = deque(maxlen=max_events)
        self._causes = np.zeros(len(MISS_CAUSES), dtype=np.int64)
        self._cause_events: deque[tuple[float, np.ndarray]] = deque(maxlen=max_events)

    def record_causes(self, counts: np.ndarray) -> None:
        """Count explained misses: ``counts[i]`` keys missed for ``MISS_CAUSES[i]``."""
        with self._lock:
            self._causes += counts
            self._cause_events.append((self._clock(), counts))

    def _causes_of(self, recent: bool) -> dict[str, int]:
        if recent:
            since = self._clock() - self.window_s
            totals = sum((counts for at, counts in self._cause_events if at >= since), np.zeros(len(MISS_CAUSES), dtype=np.int64))
        else:
            totals = self._causes
        return {cause: int(count) for cause, count in zip(MISS_CAUSES, totals)}

    def record(self, *, hits: int, misses: int, errors: int = 0, latency_s: float = 0.0) -> None:
        with self._lock:
            self._totals += (hits, misses, errors)
            self._latency_sum_s += latency_s
            self._num_calls += 1
            bucket = bisect.bisect_left(LATENCY_BUCKETS_S, latency_s)  # the first bound >= latency_s
            if bucket < len(LATENCY_BUCKETS_S):
                self._bucket_counts[bucket] += 1
            self._events.append((self._clock(), hits, misses, errors, latency_s))

    def num_calls(self, recent: bool = False) -> int:
        with self._lock:
            return len(self._window()) if recent else self._num_calls

    def histogram(self) -> LatencyHistogram:
        """Every call's latency since start, bucketed (the recent log is bounded; these counts never drop)."""
        with self._lock:
            counts, num_calls, sum_s = np.cumsum(self._bucket_counts), self._num_calls, self._latency_sum_s
        return LatencyHistogram(LATENCY_BUCKETS_S, tuple(int(c) for c in counts), num_calls, sum_s)

    def _window(self) -> list[tuple[float, int, int, int, float]]:
        since = self._clock() - self.window_s
        return [event for event in self._events if event[0] >= since]

    def snapshot(self, recent: bool = False) -> LevelStats:
        with self._lock:
            events = self._window() if recent else list(self._events)
            if recent:
                hits, misses, errors = (sum(event[i] for event in events) for i in (1, 2, 3))
                mean_s = sum(event[4] for event in events) / len(events) if events else 0.0
            else:
                hits, misses, errors = (int(x) for x in self._totals)
                mean_s = self._latency_sum_s / self._num_calls if self._num_calls else 0.0
            causes = self._causes_of(recent)
        latencies = np.array([event[4] for event in events]) if events else np.zeros(1)
        p50, p99 = np.percentile(latencies, [50, 99]) * 1000
        lookups = hits + misses
        return LevelStats(
            level=self.level,
            lookups=int(lookups),
            hits=int(hits),
            misses=int(misses),
            errors=int(errors),
            hit_rate=hits / lookups if lookups else 0.0,
            latency_mean_ms=mean_s * 1000,
            latency_p50_ms=float(p50),
            latency_p99_ms=float(p99),
            misses_by_cause=causes,
        )


@dataclass(frozen=True)
class ScopeStats:
    """One tenant's or one prompt's share of its cache's traffic."""

    requests: int
    texts: int
    hits: int
    hit_rate: float


class ScopeRecorders:
    """Request counters per tenant and per prompt name, made on first use (tenants come from the key file,
    prompts from the model's configuration: a handful each)."""

    def __init__(self, *, window_s: float):
        self._window_s = window_s
        self._tenants: dict[str, LevelRecorder] = {}
        self._prompts: dict[str, LevelRecorder] = {}
        self._lock = threading.Lock()

    def record(self, scope: Scope, *, hits: int, misses: int, latency_s: float) -> None:
        if scope.tenant is not None:
            self._recorder(self._tenants, scope.tenant).record(hits=hits, misses=misses, latency_s=latency_s)
        if scope.prompt is not None:
            self._recorder(self._prompts, scope.prompt.name).record(hits=hits, misses=misses, latency_s=latency_s)

    def _recorder(self, recorders: dict[str, LevelRecorder], name: str) -> LevelRecorder:
        recorder = recorders.get(name)
        if recorder is None:
            with self._lock:
                recorder = recorders.setdefault(name, LevelRecorder(name, window_s=self._window_s))
        return recorder

    def tenants(self, *, recent: bool = False) -> dict[str, ScopeStats]:
        return self._stats(self._tenants, recent=recent)

    def prompts(self, *, recent: bool = False) -> dict[str, ScopeStats]:
        return self._stats(self._prompts, recent=recent)

    def _stats(self, recorders: dict[str, LevelRecorder], *, recent: bool) -> dict[str, ScopeStats]:
        with self._lock:
            found = dict(recorders)
        stats = {}
        for name, recorder in sorted(found.items()):
            figures = recorder.snapshot(recent=recent)
            stats[name] = ScopeStats(recorder.num_calls(recent=recent), figures.lookups, figures.hits, figures.hit_rate)
        return stats


class RequestAccounts:
    """What one cache counts of its requests, overall and per scope (a tenant's keys, a named prompt), shared by its
    views; the levels count their own lookups."""

    def __init__(self, *, window_s: float) -> None:
        self._requests = LevelRecorder("cache", window_s=window_s)
        # Only the scopes that are not the model's own (``scope.UNSCOPED``, whose requests ``_requests`` alone counts).
        self._scopes = ScopeRecorders(window_s=window_s)

    def record(self, scope: Scope, *, hits: int, misses: int, latency_s: float) -> None:
        """One request answered: ``misses`` of its texts computed here, the rest served by a level."""
        self._requests.record(hits=hits, misses=misses, latency_s=latency_s)
        if scope.tenant is not None or scope.prompt is not None:
            self._scopes.record(scope, hits=hits, misses=misses, latency_s=latency_s)

    def stats(self, space: EmbeddingSpace, encoder: Encoder, levels: Levels, *, recent: bool) -> CacheStats:
        """Hit rates and latencies of ``space``'s cache since start, or over the recent window."""
        overall = self._requests.snapshot(recent=recent)
        encoder_stats = encoder.stats()
        return CacheStats(
            space_id=space.space_id,
            model=space.model,
            period="recent" if recent else "since_start",
            period_s=self._requests.window_s if recent else 0.0,
            requests=self._requests.num_calls(recent=recent),
            texts=overall.lookups,
            hits=overall.hits,
            hit_rate=overall.hit_rate,
            texts_computed=overall.misses,
            compute_s=encoder_stats.compute_s,
            compute_s_saved=overall.hits * encoder_stats.seconds_per_text,
            levels=levels.snapshots(recent=recent),
        )

    def tenants(self, *, recent: bool) -> dict[str, ScopeStats]:
        return self._scopes.tenants(recent=recent)

    def prompts(self, *, recent: bool) -> dict[str, ScopeStats]:
        return self._scopes.prompts(recent=recent)

    def histogram(self) -> LatencyHistogram:
        """Every whole request's latency since start."""
        return self._requests.histogram()
