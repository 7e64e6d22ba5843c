"""The vLLM endpoints as this process sees them: each one's breaker (a failure backs it off), its prefix-cache
counters from ``/metrics`` (the KV block size, a restart), and how a warm request is sent to it."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from ragcache.core.health import TierHealth
from ragcache.engines import CompletionUsage, PrefixCacheCounters, TargetUnavailableError, VLLMClient
from ragcache.observe.logs import RepeatedWarnings

from .config import PrefixRegistryConfig
from .model import PromptForm, Target
from .stats import TargetStats

__all__ = ["Targets"]

log = logging.getLogger(__name__)
# A store or target that is down would otherwise be named once a tick (109 lines in 45 s): once, then once a minute.
log.addFilter(RepeatedWarnings())


class Targets:
    """Health and counters per vLLM base URL (thread-safe; each ``TierHealth`` has its own lock)."""

    def __init__(self, vllm: VLLMClient, config: PrefixRegistryConfig, *, clock: Callable[[], float]) -> None:
        self.config = config
        self._vllm = vllm
        self._clock = clock
        self._lock = threading.Lock()  # guards the dicts
        self._health: dict[str, TierHealth] = {}  # per target: the breaker every remote dependency uses
        self._counters: dict[str, PrefixCacheCounters] = {}
        self._scraped_at: dict[str, float] = {}
        # Per target: tokens a second its engine computed rather than found cached, between its last two scrapes
        # (what turns its KV cache over, :mod:`.budget`).
        self._computed_per_s: dict[str, float] = {}
        # Endpoints that answered a warm carrying a priority with a 4xx (an older vLLM without priority
        # scheduling refuses the field): their warms go without it.
        self._priority_refused: set[str] = set()

    def health_of(self, url: str) -> TierHealth:
        with self._lock:
            health = self._health.get(url)
            if health is None:
                health = self._health[url] = TierHealth(backoff_initial_s=self.config.backoff_min_s,
                                                        backoff_max_s=self.config.backoff_max_s, clock=self._clock)
            return health

    def counters_of(self, url: str) -> PrefixCacheCounters | None:
        """``url``'s counters as last scraped (None before a scrape answered)."""
        return self._counters.get(url)

    def block_size(self, target: Target) -> int:
        counters = self._counters.get(target.base_url)
        return (counters.block_size if counters else None) or self.config.default_block_size

    def complete(self, target: Target, head: str, form: PromptForm) -> CompletionUsage:
        """The warm request, at ``warm_priority`` unless the endpoint refused the field once."""
        priority = self.config.warm_priority
        if priority is None or target.base_url in self._priority_refused:
            return self._vllm.complete_one(target, head, form)
        try:
            return self._vllm.complete_one(target, head, form, priority=priority)
        except TargetUnavailableError as exc:
            if exc.status_code not in (400, 422):
                raise
        usage = self._vllm.complete_one(target, head, form)
        with self._lock:
            self._priority_refused.add(target.base_url)
        log.warning("%s refused a request priority (no --scheduling-policy priority); its warms go without one",
                    target.base_url)
        return usage

    def failed(self, url: str, exc: TargetUnavailableError) -> float:
        """Back ``url`` off after ``exc``; returns for how long, in seconds."""
        health = self.health_of(url)
        health.record_failure(exc)
        return health.retry_at - self._clock()

    def succeeded(self, url: str) -> bool:
        """Mark ``url`` up; True when it was down: its prefixes lost their KV cache and want priming again."""
        if self.health_of(url).record_success():
            log.info("target %s is back; re-warming its prefixes", url)
            return True
        return False

    def turnover_s(self, url: str) -> float | None:
        """Seconds ``url``'s engine takes to write as many new blocks as its KV cache holds, at the rate of its last
        two scrapes (``math.inf`` while it computes nothing); None until it reported its cache's size and two scrapes."""
        with self._lock:
            counters, rate = self._counters.get(url), self._computed_per_s.get(url)
        if counters is None or rate is None or not counters.num_gpu_blocks or not counters.block_size:
            return None
        return counters.num_gpu_blocks * counters.block_size / rate if rate > 0 else math.inf

    def scrape_due(self, url: str, now: float) -> bool:
        """Whether ``url``'s counters were last read ``metrics_interval_s`` or more before ``now``."""
        return now - self._scraped_at.get(url, float("-inf")) >= self.config.metrics_interval_s

    def scrape(self, url: str) -> tuple[PrefixCacheCounters | None, bool]:
        """Read a target's prefix-cache counters (None when it failed or backs off); also a health probe and a
        restart detector: the second value is True when the target lost its KV cache since the last look."""
        health = self.health_of(url)
        if not health.may_try():
            return None, False
        try:
            counters = self._vllm.prefix_cache_counters(url)
        except TargetUnavailableError as exc:
            health.record_failure(exc)
            log.warning("scraping %s failed: %s", url, exc)
            return None, False
        now = self._clock()
        with self._lock:
            previous, previous_at = self._counters.get(url), self._scraped_at.get(url)
            self._counters[url] = counters
            self._scraped_at[url] = now
            restarted = previous is not None and counters.queries < previous.queries
            if previous is not None and previous_at is not None and now > previous_at and not restarted:
                computed = (counters.queries - counters.hits) - (previous.queries - previous.hits)
                self._computed_per_s[url] = max(0.0, computed) / (now - previous_at)
        if restarted:
            # Counters went backwards: vLLM restarted between two looks, its cache is empty.
            log.info("target %s restarted; re-warming its prefixes", url)
        return counters, self.succeeded(url) or restarted

    def stats(self, urls: set[str]) -> tuple[TargetStats, ...]:
        """Counters of the endpoints ``urls`` and of every one this process has talked to, by URL."""
        with self._lock:
            known = set(self._health)
        return tuple(self._stats_of(url) for url in sorted(urls | known))

    def _stats_of(self, url: str) -> TargetStats:
        health = self.health_of(url)
        counters = self._counters.get(url)
        return TargetStats(
            base_url=url,
            up=not health.is_down,
            num_failures=health.num_failures,
            prefix_cache_queries=counters.queries if counters else None,
            prefix_cache_hits=counters.hits if counters else None,
            prefix_cache_hit_rate=counters.hits / counters.queries if counters and counters.queries else None,
            block_size=counters.block_size if counters else None,
        )
