"""The levels of one cache, fastest first: each one's breaker, counters and writer, and the walk over them
(``walk``): each level asked only for what is still missing (counted; a level that fails is a miss), its hits
written up into the levels above (the first levels at once, the others behind).

``EmbeddingCache`` hands the walk a request's distinct keys and what is still missing to its ``MissResolver``;
``Levels`` never calls back up. Levels are named by role, not by position: ``shared`` is the first level every
process of a fleet sees (Redis), where single flight across processes publishes vectors and waits for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ragcache.core.health import TierHealth
from ragcache.core.keys import KeyList
from ragcache.core.stats import LatencyHistogram, LevelRecorder, LevelStats
from ragcache.core.tier import Expiring, Figured, MayHold, Tier, TierHits
from ragcache.core.writeback import WriteBehind
from ragcache.errors import TierUnavailableError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["Found", "Levels"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Found:
    """What the walk found for a request's distinct keys: ``vectors`` (one row per key; the rows at ``missing``
    are not written yet), ``served`` (per key, the position of the level that held it; ``len(levels)``: none did),
    ``missing`` (the positions no level held, ascending) and ``unavailable`` (the levels that were down or failed
    for this walk: their misses are theirs, not the keys')."""

    vectors: torch.Tensor
    served: np.ndarray
    missing: np.ndarray
    unavailable: frozenset[int] = frozenset()
    bypassed: frozenset[int] = frozenset()  # levels not asked: they said they hold none of these keys (``may_hold``)


class Levels:
    """``tiers`` in order, with a ``TierHealth`` (the breaker), a ``LevelRecorder`` and, below the first, a
    write-behind worker each (``write_behind=False``: every write at once). ``names``: each level's name, from the
    table of levels (``ragcache.build.LEVELS``; None: each tier's own, for tiers used bare). ``write_linger_s``
    maps a level's name to how long its writer gathers writes into one call (absent: 0). ``dim`` and ``dtype``
    are the vectors' (the cache's space's); ``window_s``, ``clock`` and ``tracer`` the cache's too
    (``EmbeddingCache`` takes them from here, so that they are given once).

    ``admit_on_reuse`` names levels that store only vectors that proved reuse: a computed vector is not
    written to them (counted ``num_declined``), and a vector served by a level above them but below L1 (asked
    for again after leaving L1) is written down into them, behind (counted ``num_admitted``). That keeps a
    costly durable level (Milvus) off the miss path: all-new traffic writes nothing to it.

    ``fleet_levels`` names the levels every process of a fleet sees (Redis, a Milvus server): single flight across
    processes publishes in the first of them below L1 (``shared``).
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        dim: int,
        dtype: torch.dtype,
        names: Sequence[str] | None = None,
        write_behind: bool = True,
        write_linger_s: Mapping[str, float] | None = None,
        admit_on_reuse: Collection[str] = (),
        fleet_levels: Collection[str] = (),
        window_s: float = 300.0,
        clock: Callable[[], float] = time.perf_counter,
        tracer: Tracer | None = None,
    ):
        self.tiers = list(tiers)
        self.names = tuple(tier.name for tier in self.tiers) if names is None else tuple(names)
        if len(self.names) != len(self.tiers) or len(set(self.names)) != len(self.names):
            raise ValueError(f"levels need one distinct name each: {self.names} for {len(self.tiers)} tiers")
        self.dim, self.dtype = dim, dtype
        self.window_s = window_s
        self._health = [TierHealth() for _ in self.tiers]
        self._recorders = [LevelRecorder(name, window_s=window_s) for name in self.names]
        self.clock = clock
        self.tracer = tracer  # None: no spans, no tracing work (ragcache.observe.tracing)
        # One writer per level below the first, so that a slow level never holds back another's writes.
        lingers = write_linger_s or {}
        unknown = (set(lingers) | set(admit_on_reuse) | set(fleet_levels)) - set(self.names)
        if unknown:
            raise ValueError(f"no level named {sorted(unknown)} among {self.names}")
        self._writers = {
            position: WriteBehind(self.store, linger_s=lingers.get(self.names[position], 0.0)) for position in range(1, len(self.tiers))
        } if write_behind else {}
        # A level may say, without a call, that it holds none of some keys (an empty Milvus collection): it is then
        # not asked, and its misses are counted as bypassed.
        self._may_hold = [tier.may_hold if isinstance(tier, MayHold) else None for tier in self.tiers]
        self._on_reuse = frozenset(position for position, name in enumerate(self.names) if name in admit_on_reuse and position)
        self._shared = next((position for position, name in enumerate(self.names) if position and name in fleet_levels), None)
        self._admission_lock = threading.Lock()
        self._num_admitted = dict.fromkeys(self._on_reuse, 0)
        self._num_declined = dict.fromkeys(self._on_reuse, 0)

    def __len__(self) -> int:
        return len(self.tiers)

    def position_of(self, name: str) -> int | None:
        """Where the level named ``name`` is in the walk (None: this cache has none)."""
        return self.names.index(name) if name in self.names else None

    @property
    def first(self) -> Tier:
        """The first level (L1): the batcher stores computed vectors there and looks there once more."""
        return self.tiers[0]

    @property
    def shared(self) -> int | None:
        """Position of the first level below L1 that every process of the fleet sees (``fleet_levels``: Redis)."""
        return self._shared

    # ---- the walk ------------------------------------------------------------------------------------------

    def walk(self, keys: KeyList, *, device: torch.device, first: TierHits | None = None) -> Found:
        """Ask each level in order for the keys no level above held, and write its hits up into those levels.
        ``first``: L1's answer already given (the resident probe's, counted by ``record``), not asked again."""
        vectors = None
        served = np.full(len(keys), len(self), dtype=np.int8)
        missing = np.arange(len(keys))
        asked = keys  # the keys at ``missing``, in order: what the next level is asked for
        unavailable: set[int] = set()
        bypassed: set[int] = set()
        for position in range(len(self)):
            if not len(missing):
                break
            may_hold = self._may_hold[position]
            if may_hold is not None and not may_hold(asked):
                self._recorders[position].record(hits=0, misses=len(asked))
                bypassed.add(position)
                continue
            hits = first if position == 0 and first is not None else self.lookup(position, asked, failed=unavailable)
            if not hits.index:
                continue
            found = missing[hits.index]
            served[found] = position
            if vectors is None and len(found) == len(keys):
                # The common hot case: one level served everything, in order; its gather is the answer.
                vectors = hits.vectors.to(device, self.dtype)
            else:
                if vectors is None:
                    vectors = torch.empty((len(keys), self.dim), dtype=self.dtype, device=device)
                vectors.index_copy_(0, torch.from_numpy(found).to(device), hits.vectors.to(device, self.dtype))
            if position:
                taken = asked if len(found) == len(asked) else asked.take(hits.index)
                self.write_up(position, taken, hits.vectors)
                if self._on_reuse:
                    self._admit(position, taken, hits.vectors)
            # A boolean mask, not np.setdiff1d: that sorts, and costs ~50 us on 32 keys.
            still = np.ones(len(missing), dtype=bool)
            still[hits.index] = False
            missing = missing[still]
            asked = asked.take(np.flatnonzero(still))
        if vectors is None:
            vectors = torch.empty((len(keys), self.dim), dtype=self.dtype, device=device)
        return Found(vectors, served, missing, frozenset(unavailable), frozenset(bypassed))

    # ---- lookups -------------------------------------------------------------------------------------------

    def lookup(self, position: int, keys: Sequence[str], *, failed: set[int] | None = None) -> TierHits:
        """Level ``position``'s hits for ``keys``, counted; a level that is down or fails is a miss (and its
        position is added to ``failed``, when given)."""
        if self.tracer is None:
            return self._lookup(position, keys, failed)
        attributes: dict[str, str | int] = {"ragcache.level": self.names[position], "ragcache.num_keys": len(keys)}
        with self.tracer.start_as_current_span("ragcache.lookup", attributes=attributes) as current:
            hits = self._lookup(position, keys, failed)
            current.set_attributes({"ragcache.num_hits": len(hits.index), "ragcache.level_down": self._health[position].is_down})
            return hits

    def _lookup(self, position: int, keys: Sequence[str], failed: set[int] | None) -> TierHits:
        recorder = self._recorders[position]
        if not self._health[position].should_try():
            recorder.record(hits=0, misses=len(keys), errors=len(keys))
            if failed is not None:
                failed.add(position)
            return self.none()
        started = self.clock()
        try:
            hits = self.tiers[position].get_many(keys)
        except TierUnavailableError as exc:
            self._note_failure(position, exc)
            recorder.record(hits=0, misses=len(keys), errors=len(keys), latency_s=self.clock() - started)
            if failed is not None:
                failed.add(position)
            return self.none()
        self._note_success(position)
        recorder.record(hits=len(hits.index), misses=len(keys) - len(hits.index), latency_s=self.clock() - started)
        return hits

    def peek(self, position: int, keys: Sequence[str]) -> TierHits:
        """Level ``position``'s hits, uncounted (the walk counted the miss already); a failure is a miss."""
        if not self._health[position].should_try():
            return self.none()
        try:
            return self.tiers[position].get_many(keys)
        except TierUnavailableError as exc:
            self._note_failure(position, exc)
            return self.none()

    def record(self, position: int, *, hits: int, misses: int, latency_s: float, traced: bool = True) -> None:
        """Count a lookup made outside ``lookup`` (the resident probe's, on the event loop), with its span
        unless ``traced`` is False (an all-resident answer, whose own span says so)."""
        self._recorders[position].record(hits=hits, misses=misses, latency_s=latency_s)
        if traced and self.tracer is not None:
            attributes: dict[str, str | int | bool] = {
                "ragcache.level": self.names[position], "ragcache.num_keys": hits + misses, "ragcache.num_hits": hits,
                "ragcache.level_down": self._health[position].is_down, "ragcache.resident_probe": True}
            started_ns = time.time_ns() - int(latency_s * 1e9)
            self.tracer.start_span("ragcache.lookup", attributes=attributes, start_time=started_ns).end()

    def none(self) -> TierHits:
        return TierHits.none(self.dim, self.dtype)

    # ---- why misses happened (ragcache.core.causes) --------------------------------------------------------

    @property
    def on_reuse(self) -> frozenset[int]:
        """Positions of the levels that store only vectors that proved reuse (``admit_on_reuse``)."""
        return self._on_reuse

    @property
    def ttl_s(self) -> tuple[float | None, ...]:
        """Per level, the time to live of its entries (a tier's ``ttl_s``; None: kept until evicted)."""
        return tuple(tier.ttl_s if isinstance(tier, Expiring) else None for tier in self.tiers)

    def record_causes(self, counts: np.ndarray) -> None:
        """Count explained misses: ``counts[level, cause]`` (``ragcache.core.stats.MISS_CAUSES``)."""
        for position, row in enumerate(counts):
            if row.any():
                self._recorders[position].record_causes(row)

    # ---- writes --------------------------------------------------------------------------------------------

    def write_up(self, below: int, keys: Sequence[str], vectors: torch.Tensor, *, num_sync: int = 1, first: int = 0) -> None:
        """Store vectors found at level ``below`` (or computed: ``below == len(self)``) in every level above it from
        ``first``; the first ``num_sync`` levels before returning, the others behind. A computed vector skips
        the levels that admit on reuse only (``admit_on_reuse``)."""
        for position in range(first, below):
            if below == len(self) and position in self._on_reuse:
                with self._admission_lock:
                    self._num_declined[position] += len(keys)
                continue
            if position < num_sync or position not in self._writers:
                self.store(position, keys, vectors)
            else:
                self._writers[position].submit(position, keys, vectors)

    def _admit(self, served_by: int, keys: Sequence[str], vectors: torch.Tensor) -> None:
        """Vectors served by level ``served_by`` below L1 proved reuse: written down, behind, into the levels
        below it that admit on reuse."""
        for position in self._on_reuse:
            if position <= served_by:
                continue
            with self._admission_lock:
                self._num_admitted[position] += len(keys)
            if position in self._writers:
                self._writers[position].submit(position, keys, vectors)
            else:
                self.store(position, keys, vectors)

    def store(self, position: int, keys: Sequence[str], vectors: torch.Tensor) -> None:
        """Write to level ``position`` now; a level that is down is skipped, one that fails is noted down."""
        if not self._health[position].should_try():
            return
        try:
            self.tiers[position].put_many(keys, vectors)
        except TierUnavailableError as exc:
            self._note_failure(position, exc)
        else:
            self._note_success(position)

    def probe(self, keys: Sequence[str]) -> None:
        """Ask every level for ``keys`` (a text nobody stores: a real round trip to each store) whatever its breaker
        says, and note each outcome as the level's state: what a health check shows before the first request, and
        while no request comes to find a level down or back."""
        for position, tier in enumerate(self.tiers):
            try:
                tier.get_many(keys)
            except TierUnavailableError as exc:
                error: TierUnavailableError | None = exc
            else:
                error = None
            if self._health[position].record_probe(error):
                if error is None:
                    log.warning("%s is back", self.names[position])
                else:
                    log.warning("%s is down, serving without it and retrying with back-off: %s", self.names[position], error)

    def _note_failure(self, position: int, exc: TierUnavailableError) -> None:
        if self._health[position].record_failure(exc):
            log.warning("%s is down, serving without it and retrying with back-off: %s", self.names[position], exc)

    def _note_success(self, position: int) -> None:
        if self._health[position].record_success():
            log.warning("%s is back", self.names[position])

    # ---- state ---------------------------------------------------------------------------------------------

    def states(self) -> dict[str, dict]:
        """Per level: up or down, the last error while down, outages so far, and the figures the level keeps
        of itself (``num_corrupt`` values dropped; ``used_bytes`` against ``capacity_bytes`` for L1)."""
        return {
            name: {
                "up": not health.is_down,
                "last_error": health.last_error if health.is_down else None,
                "num_outages": health.num_outages,
                "num_failures": health.num_failures,  # failed tries in the current outage (probes, not skips)
                "down_for_s": health.down_for_s(),
                "probed_s_ago": health.probed_s_ago(),
                **(tier.figures() if isinstance(tier, Figured) else {}),
                **self._admission_of(position),
            }
            for position, (name, tier, health) in enumerate(zip(self.names, self.tiers, self._health))
        }

    def _admission_of(self, position: int) -> dict[str, str | int]:
        """A level that admits on reuse says so, with what it took and what it declined (``admit_on_reuse``)."""
        if position not in self._on_reuse:
            return {}
        with self._admission_lock:
            return {"admission": "reuse", "num_admitted": self._num_admitted[position],
                    "num_declined": self._num_declined[position]}

    def snapshots(self, *, recent: bool) -> tuple[LevelStats, ...]:
        return tuple(recorder.snapshot(recent=recent) for recorder in self._recorders)

    def histograms(self) -> dict[str, LatencyHistogram]:
        return {recorder.level: recorder.histogram() for recorder in self._recorders}

    @property
    def pending_writes(self) -> int:
        """Writes accepted for the lower levels and not yet stored: the write-behind's backlog."""
        return sum(writer.num_pending for writer in self._writers.values())

    def flush(self) -> None:
        """Wait until every write queued for the lower levels has been stored."""
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        """Store what is queued, then close every level."""
        for writer in self._writers.values():
            writer.close()
        for tier in self.tiers:
            tier.close()
