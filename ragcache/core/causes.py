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
        now = self._clock()
        reuse_levels = range(1, min(on_reuse, default=num_levels))  # below L1, above every reuse-only level
        ttl_positions = [(position, ttl) for position, ttl in enumerate(ttl_s) if ttl is not None]
        first_ttl = ttl_positions[0][0] if ttl_positions else num_levels  # a key served above it outlived no TTL
        # A key's causes depend only on where it was served and what the ledger knew of it (absent, an older
        # generation, or current: whether it proved reuse and which TTLs it outlived), so keys are tallied by that
        # and each tally is turned into causes once: one dict look-up and one tuple per key, not a call per level.
        tally: dict[tuple, int] = {}
        seen = self._seen
        with self._lock:
            for identity, level in zip(identities, served.tolist()):
                key = hash(identity)
                entry = seen.get(key)
                if level:
                    if entry is None or entry[0] != generation:
                        state: tuple = (level, entry is None, False, 0)
                    else:
                        expired = 0  # bit p: the key outlived the TTL of level p, which it missed
                        if level > first_ttl:
                            age = now - entry[1]
                            for position, ttl in ttl_positions:
                                if position < level and age >= ttl:
                                    expired |= 1 << position
                        state = (level, None, entry[2], expired)
                    tally[state] = tally.get(state, 0) + 1
                if entry is None or entry[0] != generation or level == num_levels:  # new, drifted, or just computed
                    seen[key] = [generation, now, level in reuse_levels or (entry is not None and entry[0] == generation and entry[2])]
                    seen.move_to_end(key)
                elif level in reuse_levels:
                    entry[2] = True
            while len(seen) > self.max_entries:
                seen.popitem(last=False)
        counts = np.zeros((num_levels, len(MISS_CAUSES)), dtype=np.int64)
        for (level, absent, reused, expired), num_keys in tally.items():
            for position in range(level):
                counts[position, self._cause(position, absent, reused, bool(expired >> position & 1), unavailable,
                                             bypassed, on_reuse)] += num_keys
        return counts

    @staticmethod
    def _cause(position: int, absent: bool | None, reused: bool, expired: bool, unavailable: frozenset[int],
               bypassed: frozenset[int], on_reuse: frozenset[int]) -> int:
        """The cause of a miss at ``position`` of a key the ledger had ``absent`` (True), under an older generation
        (False) or current (None: then whether it ``reused`` and had outlived the level's TTL, ``expired``)."""
        if position in unavailable:
            return UNAVAILABLE
        if position in bypassed:
            return BYPASSED
        if absent:
            return NEVER_SEEN
        if absent is not None:
            return DRIFT
        if position in on_reuse and not reused:
            return BYPASSED
        if expired:
            return EXPIRED
        return EVICTED
