"""The keep-warm policy, as small pure pieces: the adaptive interval, the warm budget, the back-off.

vLLM evicts unreferenced KV blocks least-recently-used first, so a prefix survives as long as it is
touched again before the traffic behind it has cycled through the free blocks. Nobody can see that
deadline directly; each warm measures it instead (resident or evicted) and the interval follows.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass

from .config import PrefixRegistryConfig
from .results import WarmOutcome

__all__ = ["Schedule", "next_schedule", "judge_residency", "holds_warm", "WarmBudget"]


@dataclass(frozen=True)
class Schedule:
    """The re-warm interval, and the shortest gap between two warms that has seen an eviction."""

    interval_s: float
    eviction_gap_s: float = math.inf  # no eviction seen yet


def next_schedule(schedule: Schedule, outcome: WarmOutcome, gap_s: float, config: PrefixRegistryConfig) -> Schedule:
    """The schedule after a warm with ``outcome`` that came ``gap_s`` seconds after the previous one.

    An eviction lowers the ceiling to the gap that allowed it and halves (``shrink_factor``) the
    interval below that gap. While the prefix stays resident the interval grows by ``grow_factor``,
    but only up to ``shrink_factor`` x the ceiling: growing past a gap already known to evict would
    trade hits for a few saved warms and oscillate around the eviction horizon. The ceiling itself
    relaxes slowly (``ceiling_relax_factor`` per resident warm) so the interval can follow traffic
    that calms down. Prime, error and skipped warms say nothing about eviction and change nothing.
    """
    interval, ceiling = schedule.interval_s, schedule.eviction_gap_s
    if outcome is WarmOutcome.EVICTED:
        ceiling = min(ceiling, gap_s)
        interval = min(interval, gap_s) * config.shrink_factor
    elif outcome is WarmOutcome.RESIDENT:
        ceiling *= config.ceiling_relax_factor
        interval = min(interval * config.grow_factor, ceiling * config.shrink_factor)
    interval = min(max(interval, config.min_rewarm_interval_s), config.max_rewarm_interval_s)
    return Schedule(interval, ceiling)


def judge_residency(num_prompt_tokens: int, num_cached_tokens: int, block_size: int) -> bool:
    """Whether every full KV block of the prompt came from the cache.

    vLLM caches whole blocks only and always recomputes the last prompt token, so a complete hit
    reports ``(num_prompt_tokens - 1) // block_size * block_size`` cached tokens, not all of them.
    A prompt shorter than one block has nothing cacheable and counts as resident.
    """
    num_full = (num_prompt_tokens - 1) // block_size * block_size
    return num_cached_tokens >= num_full


def holds_warm(num_running: float | None, num_waiting: float | None, overdue_s: float,
               config: PrefixRegistryConfig) -> bool:
    """Whether a warm that has been due for ``overdue_s`` waits for its endpoint to calm down.

    It waits while the endpoint reports more requests waiting than ``warm_max_waiting`` or more running than
    ``warm_max_running`` (a limit of None never holds), but never longer than ``warm_max_defer_s``: a prefix
    whose endpoint is never idle is still kept, at the warm's low priority. An endpoint whose /metrics does not
    show its load (None) holds nothing: the gate only ever delays a warm on evidence of users.
    """
    if overdue_s >= config.warm_max_defer_s:
        return False
    too_many_waiting = config.warm_max_waiting is not None and num_waiting is not None and \
        num_waiting > config.warm_max_waiting
    too_many_running = config.warm_max_running is not None and num_running is not None and \
        num_running > config.warm_max_running
    return too_many_waiting or too_many_running


class WarmBudget:
    """At most ``per_minute`` warm requests in any 60-second window (a sliding log of send times).

    A sliding log rather than a token bucket: it never allows a burst of more than ``per_minute``
    requests even right after an idle period, which is the promise made to vLLM's operators.
    """

    window_s = 60.0

    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._sent: collections.deque[float] = collections.deque()

    def _prune(self, now: float) -> None:
        while self._sent and self._sent[0] <= now - self.window_s:
            self._sent.popleft()

    def try_acquire(self) -> bool:
        """Take one warm from the budget; False when this minute's budget is spent."""
        now = self._clock()
        self._prune(now)
        if len(self._sent) >= self._per_minute:
            return False
        self._sent.append(now)
        return True

    @property
    def per_minute(self) -> int:
        return self._per_minute

    @property
    def num_available(self) -> int:
        """Warms that could be sent right now."""
        self._prune(self._clock())
        return self._per_minute - len(self._sent)
