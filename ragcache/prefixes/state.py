"""Per-process runtime state of each pinned prefix: its warm schedule and counters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .model import PrefixStats, WarmOutcome
from .policy import Schedule

__all__ = ["WarmState"]


@dataclass
class WarmState:
    """Mutable book-keeping for one prefix version; owned by the registry and guarded by its lock."""

    version: int
    schedule: Schedule
    next_due_at: float = 0.0
    # Monotonic time of the last warm that reached vLLM: the gap to the next one is what eviction
    # had to beat.
    last_sent_at: float | None = None
    # False until a warm has loaded the prefix once; the first warm (a "prime") proves nothing about
    # eviction, so it is not counted for or against residency.
    primed: bool = False
    num_warms: int = 0
    num_resident: int = 0
    num_evicted: int = 0
    num_errors: int = 0
    num_skipped: int = 0
    num_uses: int = 0
    last_outcome: WarmOutcome | None = None
    last_warm_at: float | None = None
    lmcache_pinned_tokens: int | None = None

    def count(self, outcome: WarmOutcome, wall_time: float) -> None:
        """Record one warm's outcome."""
        if outcome is WarmOutcome.SKIPPED:
            self.num_skipped += 1
            return
        self.num_warms += 1
        self.last_outcome = outcome
        self.last_warm_at = wall_time
        if outcome is WarmOutcome.RESIDENT:
            self.num_resident += 1
        elif outcome is WarmOutcome.EVICTED:
            self.num_evicted += 1
        elif outcome is WarmOutcome.ERROR:
            self.num_errors += 1

    @property
    def residency_rate(self) -> float | None:
        judged = self.num_resident + self.num_evicted
        return self.num_resident / judged if judged else None

    def snapshot(self, name: str, num_tokens: int | None, pinned: bool) -> PrefixStats:
        """A frozen copy for callers (every counter of the same name, plus the current interval)."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(PrefixStats) if hasattr(self, f.name)}
        return PrefixStats(**shared, name=name, num_tokens=num_tokens, pinned=pinned,
                           rewarm_interval_s=self.schedule.interval_s)
