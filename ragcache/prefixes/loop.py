"""The keep-warm loop (:class:`KeepWarmLoop`): which warms are due, and each endpoint's share of a tick in a thread of
its own (:mod:`.workers`), so endpoints never wait for one another (issue 42, item 3); an eviction the events show
runs that endpoint's pass at once (item 4). :class:`~.warming.KeepWarm` below it keeps the states and sends a warm.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ragcache.engines import PrefixCacheCounters

from .model import Prefix, PrefixName
from .policy import holds_warm
from .results import WarmResult
from .state import WarmState
from .warming import KeepWarm
from .workers import EndpointWorker

__all__ = ["KeepWarmLoop"]

log = logging.getLogger(__name__)

# What one endpoint's pass returns: each warm it sent with its sort key (when it fell due, the prefix, the endpoint).
PassResult = list[tuple[tuple[float, str, str], WarmResult]]


class KeepWarmLoop(KeepWarm):
    """:class:`~.warming.KeepWarm` and the loop that keeps the pinned prefixes warm (thread-safe)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # Each endpoint's own thread: its reads and warms never wait for another endpoint's.
        self._workers: dict[str, EndpointWorker[PassResult]] = {}
        self.engines.listen(self._on_events)

    def tick(self, *, wait: bool = True) -> list[WarmResult]:
        """One pass of the loop: re-read the store when due, then ask each endpoint's own thread for a pass (scrape it
        when due, learn token ids, warm the pairs that are due and whose lease this replica holds). With ``wait``,
        until every pass ended, returning their warms (longest-waiting first); the background loop does not wait, so
        an endpoint that hangs holds only its own thread."""
        prefixes = self._refresh()
        self.size_budget(prefixes)
        urls = sorted({url for p in prefixes for url in self.endpoints_of(p)})
        passes = [self._worker(url).request() for url in urls]
        if not wait:
            return []
        done = [item for one in passes for item in (one.wait() or ())]
        return [result for _, result in sorted(done, key=lambda item: item[0])]

    def _worker(self, url: str) -> EndpointWorker[PassResult]:
        with self._lock:
            worker = self._workers.get(url)
            if worker is None:
                worker = self._workers[url] = EndpointWorker(url, lambda: self._endpoint_pass(url))
            return worker

    def _on_events(self, url: str) -> None:
        """The events of ``url`` removed or cleared blocks: its pass runs now (warm on the eviction, not the tick)."""
        if self.config.warm_on_event and self._thread is not None:
            self._worker(url).request()

    def _endpoint_pass(self, url: str) -> PassResult:
        """One endpoint's share of a tick, in its own thread: its /metrics when due, the token ids it lacks, then the
        warms due there (each with its sort key: when it fell due, the prefix, the endpoint)."""
        prefixes = [p for p in self._known.copies() if url in self.endpoints_of(p)]
        scraped = self.scrape(url) if self._targets.scrape_due(url, self._clock()) else None
        # Every pair's lease is checked (and renewed) each pass, due or not: a holder that let its lease lapse
        # between two warms would hand its schedule to another replica and both would warm.
        held = [p for p in prefixes if p.pinned and self._gate.holds(p.name, url)]
        self._learn_tokens(prefixes, url)
        self._follow_events(held, url)
        due: list[tuple[float, str, str]] = []
        with self._lock:
            for prefix in held:
                state = self._state_for(prefix, url)
                if self._clock() >= state.next_due_at and self._targets.health_of(url).may_try() and \
                        self._wanted(prefix, url, state):
                    due.append((state.next_due_at, prefix.name, url))
        due = self._not_held_busy(due, url, scraped)
        # Prefixes in use first (the budget follows use), then the longest-waiting first, so a spent budget delays
        # every prefix fairly instead of starving the ones that sort last; an idle one leaves the budget's reserve.
        idle = {name for _, name, _ in due if self.uses.idle_s(name) is not None}
        reserve = self.uses.idle_reserve(self.budget_per_minute)
        return [(key, self.warm(PrefixName(key[1], key[1]), url, reserve=reserve if key[1] in idle else 0))
                for key in sorted(due, key=lambda key: (key[1] in idle, key))]

    def _learn_tokens(self, prefixes: list[Prefix], url: str) -> None:
        """Every prefix's token ids on ``url`` (pinned or not: routing needs them too), once per version, where it
        publishes KV events and is not backing off (a failure is asked again next pass)."""
        for prefix in prefixes:
            if self.engines.needs_tokens(prefix, url) and self._targets.health_of(url).may_try():
                self.engines.learn_tokens(prefix, url)

    def _follow_events(self, held: list[Prefix], url: str) -> None:
        """Where the engine publishes KV events: make due at once every prefix whose blocks the events show removed
        since the last pass (warm on eviction), judging whether churn evicts it faster than it can be re-warmed."""
        if not self.engines.publishes(url) or not self.engines.take_changed(url):
            return
        now = self._clock()
        for prefix in held:
            with self._lock:
                state = self._state_for(prefix, url)
            if self.engines.view(prefix, url).evicted:
                with self._lock:
                    self._evicted(state, now)

    def _evicted(self, state: WarmState, now: float) -> None:
        """The events show ``state``'s prefix evicted (caller locks): due now, unless churn makes it not keepable."""
        if state.not_keepable_until is not None and now < state.not_keepable_until:
            return  # not warmed meanwhile: an eviction now says nothing of how fast churn undoes a warm
        gap_s = None if state.last_sent_at is None else now - state.last_sent_at
        if gap_s is not None and gap_s < self.config.unkeepable_within_s:
            state.num_quick_evictions += 1
            state.quickest_eviction_s = min(gap_s, state.quickest_eviction_s or gap_s)
        else:
            state.num_quick_evictions = 0
        if state.num_quick_evictions >= self.config.unkeepable_after:
            if state.not_keepable_until is None:
                log.info("prefix on %s is evicted within %.2fs of each warm: not keepable, warms stop for %.0fs",
                         state.base_url, state.quickest_eviction_s or 0.0, self.config.unkeepable_retry_s)
            state.not_keepable_until = now + self.config.unkeepable_retry_s
        state.next_due_at = min(state.next_due_at, now)

    def _wanted(self, prefix: Prefix, url: str, state: WarmState) -> bool:
        """Whether a due warm is worth sending (caller locks): not while churn makes the prefix not keepable, nor while
        the engine's events show it whole (the timer is only a fallback there; it is pushed to the longest interval)."""
        now = self._clock()
        if state.not_keepable_until is not None:
            if now < state.not_keepable_until:
                return False
            state.not_keepable_until = None  # try again once: traffic may have calmed
            # One more quick eviction is enough to stop again: churn that has not calmed costs one warm a retry.
            state.num_quick_evictions = self.config.unkeepable_after - 1
        if state.primed and self.engines.view(prefix, url).fully_resident:
            if self.engines.check_due(url):
                return True  # a real warm, now and then, checks what the events claim (:mod:`.trust`)
            state.num_warms_avoided += 1
            self.num_warms_avoided += 1
            state.next_due_at = now + self.config.max_rewarm_interval_s
            return False
        return True

    def _not_held_busy(self, due: list[tuple[float, str, str]], url: str,
                       scraped: PrefixCacheCounters | None) -> list[tuple[float, str, str]]:
        """The due warms that may go out now: those whose endpoint is not busy with users by its own /metrics
        (``scraped`` when this pass read it, else read now), or that have waited ``warm_max_defer_s``
        (see :func:`.policy.holds_warm`)."""
        if not due or (self.config.warm_max_waiting is None and self.config.warm_max_running is None):
            return due
        counters = scraped if scraped is not None else self.scrape(url)
        running, waiting = (counters.num_running, counters.num_waiting) if counters else (None, None)
        now = self._clock()
        ready = []
        with self._lock:
            for due_at, name, _ in due:
                state = self._states.get((name, url))
                if state is not None and holds_warm(running, waiting, now - due_at, self.config):
                    self.num_warms_held_busy += not state.held
                    state.held = True
                else:
                    ready.append((due_at, name, url))
        return ready

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.tick_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick(wait=False)
            except Exception:  # the loop must survive anything; the next tick retries
                log.exception("prefix keep-warm tick failed")

    def start(self) -> None:
        """Start the keep-warm loop in a daemon thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self.engines.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ragcache-prefix-warmer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and every endpoint's thread (a warm in flight finishes first, within its deadline)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.stop(timeout_s=self.config.request_timeout_s + 5)
        self.engines.stop()

