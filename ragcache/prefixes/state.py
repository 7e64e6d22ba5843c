"""Per-process runtime state of each pinned prefix on each vLLM endpoint: its warm schedule and counters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .model import Prefix
from .policy import Schedule
from .results import WarmOutcome
from .stats import EndpointStats, PrefixStats

__all__ = ["WarmState", "summarize"]


@dataclass
class WarmState:
    """Book-keeping for one prefix version on one endpoint; owned by the registry and guarded by its lock.

    Each endpoint has its own schedule: vLLM replicas evict independently (each sees its own traffic), so an
    eviction on one shortens that one's interval only and never makes the others be warmed more often.
    """

    version: int
    base_url: str
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
    last_outcome: WarmOutcome | None = None
    last_judged: WarmOutcome | None = None
    last_warm_at: float | None = None
    lmcache_pinned_tokens: int | None = None
    # True while a due warm is held back because the endpoint is busy (counted once per hold).
    held: bool = False
    # With KV events (:mod:`.engine_view`): evictions seen within unkeepable_within_s of a warm, in a row, the
    # shortest such gap, and until when (monotonic) no warm is sent because churn evicts the prefix faster.
    num_quick_evictions: int = 0
    quickest_eviction_s: float | None = None
    not_keepable_until: float | None = None
    num_warms_avoided: int = 0  # due timer warms not sent: the events showed the prefix whole
    # Warms held back while the prefix was idle and the budget had no room beyond what prefixes in use may need;
    # idle_deferred until one goes out again.
    num_idle_deferred: int = 0
    idle_deferred: bool = False

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
            self.last_judged = outcome
        elif outcome is WarmOutcome.EVICTED:
            self.num_evicted += 1
            self.last_judged = outcome
        elif outcome is WarmOutcome.ERROR:
            self.num_errors += 1

    @property
    def residency_rate(self) -> float | None:
        return _rate(self.num_resident, self.num_evicted)

    def snapshot(self) -> EndpointStats:
        """A frozen copy for callers."""
        return EndpointStats(
            base_url=self.base_url,
            resident=None if self.last_judged is None else self.last_judged is WarmOutcome.RESIDENT,
            last_outcome=self.last_outcome, last_warm_at=self.last_warm_at, num_warms=self.num_warms,
            num_resident=self.num_resident, num_evicted=self.num_evicted, num_errors=self.num_errors,
            num_skipped=self.num_skipped, residency_rate=self.residency_rate,
            rewarm_interval_s=self.schedule.interval_s)


def summarize(prefix: Prefix, states: Sequence[WarmState], num_uses: int) -> PrefixStats:
    """The prefix's stats: counters summed over its endpoints' states (target first), and each endpoint's."""
    per_endpoint = tuple(state.snapshot() for state in states)
    latest = max((s for s in states if s.last_warm_at is not None), key=lambda s: s.last_warm_at or 0.0,
                 default=None)
    num_resident = sum(s.num_resident for s in states)
    num_evicted = sum(s.num_evicted for s in states)
    pinned_tokens = [s.lmcache_pinned_tokens for s in states if s.lmcache_pinned_tokens is not None]
    return PrefixStats(
        name=prefix.name, version=prefix.version, num_tokens=prefix.num_tokens, pinned=prefix.pinned,
        num_warms=sum(s.num_warms for s in states), num_resident=num_resident, num_evicted=num_evicted,
        num_errors=sum(s.num_errors for s in states), num_skipped=sum(s.num_skipped for s in states),
        residency_rate=_rate(num_resident, num_evicted),
        last_outcome=latest.last_outcome if latest else None, last_warm_at=latest.last_warm_at if latest else None,
        # The shortest: the prefix is re-warmed somewhere at least this often.
        rewarm_interval_s=min((s.schedule.interval_s for s in states), default=0.0),
        num_uses=num_uses, lmcache_pinned_tokens=max(pinned_tokens) if pinned_tokens else None,
        endpoints=per_endpoint)


def _rate(num_resident: int, num_evicted: int) -> float | None:
    judged = num_resident + num_evicted
    return num_resident / judged if judged else None
