"""Keep-warm: this process's schedule of warm requests for every (prefix, endpoint), and how one warm is sent
(through :mod:`.targets`, which keeps each endpoint's health and counters); the loop that sends the due ones is
:mod:`.loop`.

A warm is the prefix sent as a one-token completion; ``usage.prompt_tokens_details.cached_tokens`` says whether
it was still resident, and the interval adapts (:mod:`.policy`). A target that fails is backed off; one that
comes back (or restarted, its counters gone backwards) lost its KV cache, and its prefixes are primed again.
Which prefixes requests use is :mod:`.usage`'s; what keep-warm reports (residency views, stats) is :mod:`.report`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Callable

from ragcache.engines import PrefixCacheCounters, TargetUnavailableError, VLLMClient
from ragcache.errors import InvalidInputError, TierUnavailableError
from ragcache.observe.logs import RepeatedWarnings
from ragcache.outbound import canonical_url
from ragcache.retrieval.names import tenant_of

from .allow import TargetPolicy
from .budget import sized_budget
from .config import PrefixRegistryConfig
from .engine_view import EngineView
from .known import KnownPrefixes
from .lease import WarmGate
from .model import Prefix, PrefixName, PromptForm, Target
from .policy import Schedule, judge_residency, next_schedule
from .results import WarmOutcome, WarmResult
from .state import WarmState
from .targets import Targets
from .text import template_head
from .usage import PrefixUse

__all__ = ["KeepWarm"]

log = logging.getLogger(__name__)
# A store or target that is down would otherwise be named once a tick (109 lines in 45 s): once, then once a minute.
log.addFilter(RepeatedWarnings())

# The outcomes of a warm that vLLM answered: each one moves the schedule.
ANSWERED = (WarmOutcome.PRIME, WarmOutcome.RESIDENT, WarmOutcome.EVICTED)


class KeepWarm:
    """Warm states per (prefix, endpoint), the warms' and the uses' counts (thread-safe; the loop: :mod:`.loop`).

    HTTP calls to vLLM are made outside the lock so stats never wait on vLLM."""

    def __init__(
        self,
        known: KnownPrefixes,
        targets: Targets,
        vllm: VLLMClient,
        config: PrefixRegistryConfig,
        *,
        gate: WarmGate,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        policy: TargetPolicy | None = None,
        engines: EngineView | None = None,
        uses: PrefixUse | None = None,
    ) -> None:
        self.config = config
        self._policy = policy or TargetPolicy(config)
        self.engines = engines or EngineView(config.kv_events, vllm, config, clock=clock)
        self.uses = uses or PrefixUse(config, clock)  # which prefixes requests use: those first, an idle one in the room
        self._known = known
        self._targets = targets
        self._vllm = vllm  # for LMCache's pin API; the warms themselves go through the targets
        self._gate = gate
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.RLock()
        # (prefix name, endpoint base URL) -> the warm state of the prefix's current version there.
        self._states: dict[tuple[str, str], WarmState] = {}
        self._store_read_at = float("-inf")
        self.num_warms_sent = 0
        self.num_warms_deferred = 0
        self.num_warms_held_busy = 0
        self.num_warms_avoided = 0
        # The fleet's warm budget as last sized from the engines' figures (:mod:`.budget`); None: the configured one.
        self.budget_per_minute: int | None = None

    def endpoints_of(self, prefix: Prefix) -> tuple[str, ...]:
        """The vLLM base URLs that keep ``prefix`` warm: its target first, then its replicas, then the
        deployment's list when its target is on it."""
        fleet = self.config.endpoints if prefix.target.base_url in self.config.endpoints else ()
        urls = dict.fromkeys((prefix.target.base_url, *prefix.endpoints, *fleet))
        # A record stored before the operator's list allowed none of its URLs is kept but warmed nowhere.
        return self._policy.allowed_of(urls, tenant_of(prefix.name))

    def states_of(self, prefix: Prefix) -> list[WarmState]:
        """Copies of ``prefix``'s warm states on each of its endpoints (the target first), for reports."""
        with self._lock:
            return [copy.copy(self._state_for(prefix, url)) for url in self.endpoints_of(prefix)]

    def all_primed(self, prefix: Prefix) -> bool:
        """Whether ``prefix``'s current version was warmed on every one of its endpoints."""
        with self._lock:
            states = [self._state_for(prefix, url) for url in self.endpoints_of(prefix)]
        return all(state.primed for state in states)

    def forget(self, name: str) -> None:
        """Drop the warm states and the uses of prefix ``name`` (it was deleted)."""
        with self._lock:
            self._states = {key: state for key, state in self._states.items() if key[0] != name}
        self.uses.forget(name)
        self.engines.forget(name)

    # ----- warming ------------------------------------------------------------------------------

    def warm_all(self, name: PrefixName) -> tuple[WarmResult, ...]:
        """Warm prefix ``name`` on every one of its endpoints now (target first); the results carry its public name."""
        prefix = self._known.get(name)
        return tuple(self.warm(name, url) for url in self.endpoints_of(prefix))

    def warm(self, name: PrefixName, endpoint: str | None = None, *, reserve: int = 0) -> WarmResult:
        """Warm prefix ``name`` on ``endpoint`` (default: its target) now, within the budget (leaving ``reserve`` of
        it: an idle prefix's warm) and the endpoint's back-off, and record the result (under the public name, as errors
        name it)."""
        prefix = self._known.get(name)
        url = prefix.target.base_url if endpoint is None else canonical_url(endpoint, "endpoint")
        if url not in self.endpoints_of(prefix):
            raise InvalidInputError(f"prefix {name.public!r} is not served by {url!r}", field="endpoint")
        target = Target(url, prefix.target.model)

        def skipped(error: str) -> WarmResult:
            return WarmResult(name.public, prefix.version, WarmOutcome.SKIPPED, error=error, endpoint=url)

        claimed = self.engines.claim(prefix, url)  # what the events say it holds: checked against what the warm finds
        with self._lock:
            state = self._state_for(prefix, url)
            if not self._targets.health_of(url).may_try():
                return self._finish(state, skipped("target is backing off"))
            if not self._gate.try_spend(tenant_of(prefix.name), reserve, self.budget_per_minute):
                self.num_warms_deferred += 1
                if reserve:
                    state.num_idle_deferred += 1
                    state.idle_deferred = True
                    return self._finish(state, skipped("idle: kept warm only while the warm budget has room"))
                return self._finish(state, skipped("warm budget for this minute (the fleet's or the tenant's) is spent"))
            state.idle_deferred = False
            self.num_warms_sent += 1
            primed = state.primed
        head = template_head(prefix.text, prefix.is_template)
        try:
            usage = self._targets.complete(target, head, prefix.form)
        except TargetUnavailableError as exc:
            with self._lock:
                delay = self._targets.failed(url, exc)
                log.warning("warming %s on %s failed (%s); it backs off %.1fs", prefix.name, url, exc, delay)
                return self._finish(state, WarmResult(name.public, prefix.version, WarmOutcome.ERROR,
                                                      error=str(exc), endpoint=url))
        if self._targets.succeeded(url):
            self._reprime(url)
        if prefix.num_tokens is None and prefix.form is PromptForm.COMPLETION:
            self._fill_token_count(prefix, usage.num_prompt_tokens)
        self.engines.check(url, claimed, usage.num_prompt_tokens, usage.num_cached_tokens)
        if primed:
            resident = judge_residency(usage.num_prompt_tokens, usage.num_cached_tokens, self._targets.block_size(target))
            outcome = WarmOutcome.RESIDENT if resident else WarmOutcome.EVICTED
        else:
            outcome = WarmOutcome.PRIME
        result = WarmResult(name.public, prefix.version, outcome, usage.num_prompt_tokens,
                            usage.num_cached_tokens, usage.latency_s, endpoint=url)
        if outcome is WarmOutcome.PRIME and prefix.lmcache_controller_url:
            self._lmcache_pin(prefix, target, head, state)
        with self._lock:
            state.primed = True
            state.held = False
            return self._finish(state, result)

    def _fill_token_count(self, prefix: Prefix, num_tokens: int) -> None:
        """Record the token count vLLM reported, for a prefix registered while it was down."""
        try:
            current = self._known.store.get(prefix.name)
        except TierUnavailableError:
            return  # the count stays unknown until the next warm; nothing else depends on it
        if current is not None and current.version == prefix.version and current.num_tokens is None:
            try:
                self._known.put(dataclasses.replace(current, num_tokens=num_tokens))
            except TierUnavailableError:
                return

    def _finish(self, state: WarmState, result: WarmResult) -> WarmResult:
        """Count ``result`` and schedule the next warm (caller holds the lock)."""
        state.count(result.outcome, self._wall_clock())
        now = self._clock()
        if result.outcome in ANSWERED:
            gap_s = now - state.last_sent_at if state.last_sent_at is not None else state.schedule.interval_s
            state.schedule = next_schedule(state.schedule, result.outcome, gap_s, self.config)
            state.last_sent_at = now
        if result.outcome is WarmOutcome.SKIPPED:
            # Stay due: the warm goes out as soon as the budget or the back-off allows.
            state.next_due_at = min(state.next_due_at, self._clock())
        elif result.outcome is WarmOutcome.ERROR:
            state.next_due_at = self._targets.health_of(state.base_url).retry_at
        else:
            state.next_due_at = now + state.schedule.interval_s
        return result

    def _lmcache_pin(self, prefix: Prefix, target: Target, head: str, state: WarmState) -> None:
        """Back the keep-warm with LMCache's pin API; best effort, a failure is logged only."""
        assert prefix.lmcache_controller_url is not None
        try:
            tokens = self._vllm.tokenize(target, head)
            pinned = self._vllm.lmcache_pin(prefix.lmcache_controller_url, tokens,
                                            self.config.lmcache_instance_id, self.config.lmcache_location)
        except TargetUnavailableError as exc:
            log.warning("LMCache pin of %s failed: %s", prefix.name, exc)
            return
        with self._lock:
            state.lmcache_pinned_tokens = pinned

    def scrape(self, url: str) -> PrefixCacheCounters | None:
        """Read a target's prefix-cache counters (:meth:`.targets.Targets.scrape`); a target that lost its KV cache
        has its prefixes primed again."""
        counters, lost_cache = self._targets.scrape(url)
        if lost_cache:
            self._reprime(url)
        return counters

    def _reprime(self, url: str) -> None:
        with self._lock:
            now = self._clock()
            for (_name, base_url), state in self._states.items():
                if base_url == url:
                    state.primed = False
                    state.next_due_at = now

    def _state_for(self, prefix: Prefix, url: str) -> WarmState:
        """The warm state of ``prefix``'s current version on ``url``; a new version starts afresh (caller locks)."""
        state = self._states.get((prefix.name, url))
        self.uses.seen(prefix.name)  # first seen: idle from here on until a use
        if state is None or state.version != prefix.version:
            state = WarmState(version=prefix.version, base_url=url,
                              schedule=Schedule(self.config.initial_rewarm_interval_s), next_due_at=self._clock())
            self._states[(prefix.name, url)] = state
        return state

    def size_budget(self, prefixes: list[Prefix]) -> None:
        """Size the warm budget for ``prefixes`` from the engines' last figures (:mod:`.budget`), when configured to."""
        if not self.config.warm_budget_sized:
            return
        with self._lock:
            pairs = [(self._targets.turnover_s(url), self._state_for(p, url).primed)
                     for p in prefixes if p.pinned for url in self.endpoints_of(p)]
        published = {url for p in prefixes if p.pinned for url in self.endpoints_of(p) if self.engines.publishes(url)}
        ceiling = self.config.warm_budget_per_minute
        self.budget_per_minute = sized_budget(pairs, floor=min(self.config.warm_budget_min_per_minute, ceiling),
                                              ceiling=ceiling,
                                              checks_per_minute=len(published) * 60 / self.config.verify_interval_s)

    def _refresh(self) -> list[Prefix]:
        """The prefixes to consider this tick: from the store, or the last copy while it is down."""
        now = self._clock()
        if now - self._store_read_at >= self.config.store_refresh_interval_s:
            try:
                listed = self._known.store.list()
            except TierUnavailableError as exc:
                log.warning("prefix store unavailable, warming the last known list: %s", exc)
            else:
                self._known.replace(listed)
                live = {(p.name, url) for p in listed for url in self.endpoints_of(p)}
                with self._lock:
                    self._states = {key: s for key, s in self._states.items() if key in live}
                self._store_read_at = now
        return self._known.copies()
