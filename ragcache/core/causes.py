"""Why each miss happened: per level, every key a level was asked for and did not hold gets one cause of
``ragcache.core.stats.MISS_CAUSES``, counted in the level's stats (``misses_by_cause``).

A level cannot say why it lacks a key (a hash table holds what it holds), so this process remembers the texts
it has seen, per scope (``MissLedger``: the generation of the model they were seen under, when, and whether
they proved reuse), and a miss is judged against that:

- ``unavailable``: the level was down or failed for that call;
- ``never_seen``: the text was never seen here under this scope (or so long ago the ledger forgot it);
- ``drift``: seen, but under an earlier generation of the model (``ragcache.models.drift``): its old vector is
  no longer the model's, so no level may serve it;
- ``bypassed``: the level was not asked (it said it holds none of the keys: an empty L3 collection), or it
  admits only vectors that proved reuse (L3 by default with a disk level) and this one has not yet;
- ``expired``: the level keeps entries for a time to live (L2's ``ttl_s``) and the text was first seen longer
  ago than that;
- ``evicted``: the rest — seen, current, admitted, within any TTL: the level dropped it for room (or another
  process of the fleet never wrote it there; the ledger is this process's memory).

Cost: nothing for a request that L1 answers whole; otherwise one dict look-up per distinct missing key.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from ragcache.core.stats import MISS_CAUSES

__all__ = ["MissLedger"]

NEVER_SEEN, EVICTED, EXPIRED, DRIFT, BYPASSED, UNAVAILABLE = range(len(MISS_CAUSES))


class MissLedger:
    """The texts this process has seen, at most ``max_entries`` of them (the oldest forgotten first)."""

    def __init__(self, max_entries: int = 100_000, *, clock: Callable[[], float] = time.monotonic):
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        # identity -> [generation, first seen (clock seconds), proved reuse]
        self._seen: OrderedDict[int, list] = OrderedDict()

    def explain(
        self,
        identities: Sequence[Hashable],
        generation: int,
        served: np.ndarray,
        *,
        num_levels: int,
        unavailable: frozenset[int],
        bypassed: frozenset[int],
        on_reuse: frozenset[int],
        ttl_s: Sequence[float | None],
    ) -> np.ndarray:
        """Counts ``[level, cause]`` for one walk: ``served[i]`` is the level that held key ``i`` (``num_levels``:
        none), so key ``i`` missed at every level above it. Then remembers what the walk saw."""
        counts = np.zeros((num_levels, len(MISS_CAUSES)), dtype=np.int64)
        now = self._clock()
        reuse_levels = range(1, min(on_reuse, default=num_levels))  # below L1, above every reuse-only level
        with self._lock:
            for identity, level in zip(identities, served.tolist()):
                key = hash(identity)
                entry = self._seen.get(key)
                for position in range(level):
                    counts[position, self._cause(position, entry, generation, now, unavailable, bypassed, on_reuse, ttl_s)] += 1
                self._remember(key, entry, generation, now, proved_reuse=level in reuse_levels,
                               written=level == num_levels)
        return counts

    @staticmethod
    def _cause(position: int, entry: list | None, generation: int, now: float, unavailable: frozenset[int],
               bypassed: frozenset[int], on_reuse: frozenset[int], ttl_s: Sequence[float | None]) -> int:
        if position in unavailable:
            return UNAVAILABLE
        if position in bypassed:
            return BYPASSED
        if entry is None:
            return NEVER_SEEN
        if entry[0] != generation:
            return DRIFT
        if position in on_reuse and not entry[2]:
            return BYPASSED
        ttl = ttl_s[position]
        if ttl is not None and now - entry[1] >= ttl:
            return EXPIRED
        return EVICTED

    def _remember(self, key: int, entry: list | None, generation: int, now: float, *, proved_reuse: bool,
                  written: bool) -> None:
        """Note a key the walk saw; one computed (``written``) was stored in the levels again just now."""
        if entry is None or entry[0] != generation or written:
            reused = proved_reuse or (entry is not None and entry[0] == generation and entry[2])
            self._seen[key] = [generation, now, reused]
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_entries:
                self._seen.popitem(last=False)
        elif proved_reuse:
            entry[2] = True
