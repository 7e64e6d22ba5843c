"""The KV-prefix registry: register, render, warm and measure named prefixes on vLLM targets.

vLLM cannot pin a prefix, so "pinned" here means keep-warm: the registry sends the prefix as a
one-token completion when it is registered and again before it would be evicted, reads
``usage.prompt_tokens_details.cached_tokens`` to learn whether it was still resident, and adapts the
interval (see :mod:`.policy`). A target that fails is reported down and backed off; registration never
depends on vLLM being up, and warming resumes by itself when it comes back.

A prefix lives on every **endpoint** of its deployment: its target, the replicas it names, and (when its target
is one of them) the deployment-wide ``config.endpoints``. Each endpoint has its own schedule and counters,
since each vLLM replica evicts on its own. Across ragcache replicas, a :class:`~.lease.WarmGate` decides
which replica warms which (prefix, endpoint) and holds the fleet-wide budget.
"""

from __future__ import annotations

import builtins  # the class's own list() method shadows the builtin in its annotations
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import redis

from ragcache.core.health import TierHealth
from ragcache.errors import InvalidInputError, NotFoundError, TierUnavailableError

from .config import PrefixRegistryConfig
from .lease import LocalWarmGate, RedisWarmGate, WarmGate
from .model import (
    MAX_USES_PER_REPORT,
    Prefix,
    PrefixSpec,
    PrefixStats,
    PromptForm,
    RegisterResult,
    RegistryStats,
    Target,
    TargetStats,
    WarmOutcome,
    WarmResult,
    check_name,
    content_hash,
)
from .policy import Schedule, WarmBudget, holds_warm, judge_residency, next_schedule
from .state import WarmState, summarize
from .store import PrefixStore, make_store
from .text import find_volatile, render_messages, render_text, template_head
from .tokens import LocalTokenCounter
from .vllm_client import CompletionUsage, PrefixCacheCounters, TargetBadResponseError, TargetUnavailableError, VLLMClient

__all__ = ["PrefixRegistry"]

log = logging.getLogger(__name__)

TokenCounter = Callable[[Target, str], "int | None"]
# Replicas one prefix may name (each is warmed on its own schedule): a bound on the work one registration adds.
MAX_ENDPOINTS = 64


class PrefixRegistry:
    """Registered prefixes (in a shared store) plus this process's keep-warm loop and counters.

    Thread-safe: the HTTP app calls it from request threads while :meth:`start` runs the loop in a
    background thread. HTTP calls to vLLM are made outside the lock so stats never wait on vLLM.
    """

    def __init__(
        self,
        store: PrefixStore,
        vllm: VLLMClient,
        config: PrefixRegistryConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        token_counter: TokenCounter | None = None,
        gate: WarmGate | None = None,
    ) -> None:
        self.config = config or PrefixRegistryConfig()
        self._store = store
        self._vllm = vllm
        self._clock = clock
        self._wall_clock = wall_clock
        self._token_counter = token_counter
        self._lock = threading.RLock()
        self._gate = gate or LocalWarmGate(WarmBudget(self.config.warm_budget_per_minute, clock))
        # (prefix name, endpoint base URL) -> the warm state of the prefix's current version there.
        self._states: dict[tuple[str, str], WarmState] = {}
        self._uses: dict[str, int] = {}
        self._health: dict[str, TierHealth] = {}  # per target: the breaker every remote dependency uses
        self._counters: dict[str, PrefixCacheCounters] = {}
        self._scraped_at: dict[str, float] = {}
        # Last list read from the store: the loop keeps warming from it while the store is down.
        self._known: dict[str, Prefix] = {}
        self._store_read_at = float("-inf")
        self._num_warms_sent = 0
        self._num_warms_deferred = 0
        self._num_warms_held_busy = 0
        # Endpoints that answered a warm carrying a priority with a 4xx (an older vLLM without priority
        # scheduling refuses the field): their warms go without it.
        self._priority_refused: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def create(
        cls,
        config: PrefixRegistryConfig | None = None,
        *,
        redis_client: redis.Redis | None = None,
        http: httpx.Client | None = None,
    ) -> PrefixRegistry:
        """The production wiring: Redis (or the local file) store, an httpx client, local tokenizers; with
        Redis, leases and the warm budget are shared by every replica (:class:`~.lease.RedisWarmGate`)."""
        config = config or PrefixRegistryConfig()
        store = make_store(redis_client, config.file_path, config.redis_key)
        gate = None
        if redis_client is not None:
            gate = RedisWarmGate(redis_client, budget_per_minute=config.warm_budget_per_minute,
                                 lease_ttl_s=config.lease_ttl_s, key_prefix=config.redis_key)
        vllm = VLLMClient(http, timeout_s=config.request_timeout_s)
        return cls(store, vllm, config, token_counter=LocalTokenCounter(), gate=gate)

    # ----- registration -------------------------------------------------------------------------

    def register(self, spec: PrefixSpec) -> RegisterResult:
        """Store ``spec`` (a new version when its content changed) and warm it once if pinned.

        Succeeds even when vLLM is down: the warm then reports an error and the loop retries it.
        """
        head = _validate(spec)
        warnings = [span.message() for span in find_volatile(head)]
        digest = content_hash(spec.text, spec.target, spec.is_template, spec.form)
        existing = self._store.get(spec.name)
        now = self._wall_clock()
        new_version = existing is None or existing.content_hash != digest
        num_tokens = self._count_tokens(spec.target, head) if new_version else existing.num_tokens  # type: ignore[union-attr]
        prefix = Prefix(
            name=spec.name,
            text=spec.text,
            target=spec.target,
            is_template=spec.is_template,
            form=spec.form,
            lmcache_controller_url=spec.lmcache_controller_url,
            pinned=spec.pinned,
            version=1 if existing is None else existing.version + int(new_version),
            num_tokens=num_tokens,
            content_hash=digest,
            created_at=now if existing is None else existing.created_at,
            updated_at=now if new_version or _flags_changed(existing, spec) else existing.updated_at,  # type: ignore[union-attr]
            endpoints=tuple(dict.fromkeys(spec.endpoints)),
        )
        self._store.put(prefix)
        with self._lock:
            self._known[prefix.name] = prefix
            states = [self._state_for(prefix, url) for url in self.endpoints_of(prefix)]
        block_size = self._block_size(prefix.target)
        if num_tokens is not None and num_tokens <= block_size:
            warnings.append(f"prefix has {num_tokens} tokens, not more than one KV block ({block_size}); "
                            "vLLM caches whole blocks only, so nothing of it is reused")
        warms: tuple[WarmResult, ...] = ()
        if prefix.pinned and (new_version or not all(state.primed for state in states)):
            warms = self.warm_all(prefix.name)
        return RegisterResult(prefix, existing is None, new_version, tuple(warnings), warms[0] if warms else None,
                              warms)

    def endpoints_of(self, prefix: Prefix) -> tuple[str, ...]:
        """The vLLM base URLs that keep ``prefix`` warm: its target first, then its replicas, then the
        deployment's list when its target is on it."""
        fleet = self.config.endpoints if prefix.target.base_url in self.config.endpoints else ()
        return tuple(dict.fromkeys((prefix.target.base_url, *prefix.endpoints, *fleet)))

    def _count_tokens(self, target: Target, head: str) -> int | None:
        """Tokens of ``head``: the local tokenizer when there is one, else vLLM's /tokenize."""
        if self._token_counter is not None:
            counted = self._token_counter(target, head)
            if counted is not None:
                return counted
        try:
            return self._vllm.count_tokens(target, head)
        except TargetBadResponseError:
            raise  # not vLLM's answer (or not one it sends): the caller's to hear about (502), not to wait out
        except TargetUnavailableError as exc:
            log.info("cannot count tokens now (%s); filled in by the first warm", exc)
            return None

    def get(self, name: str) -> Prefix:
        """The current version of prefix ``name``; :class:`NotFoundError` when there is none."""
        try:
            prefix = self._store.get(name)
        except TierUnavailableError:
            prefix = self._known.get(name)  # serve the last copy while the store is down
        if prefix is None:
            raise NotFoundError(f"no prefix named {name!r}")
        return prefix

    def list(self) -> list[Prefix]:
        """Every registered prefix, by name."""
        return self._store.list()

    def delete(self, name: str) -> None:
        """Forget prefix ``name`` (it is no longer warmed); :class:`NotFoundError` when unknown."""
        if not self._store.delete(name):
            raise NotFoundError(f"no prefix named {name!r}")
        with self._lock:
            self._known.pop(name, None)
            self._uses.pop(name, None)
            self._states = {key: state for key, state in self._states.items() if key[0] != name}

    # ----- prompt building ----------------------------------------------------------------------

    def render(self, name: str, **slots: Any) -> str:
        """The prompt for prefix ``name``: its head byte for byte, then the slots filled in."""
        prefix = self.get(name)
        text = render_text(prefix, slots)
        self.record_use(name)
        return text

    def messages(self, name: str, user: str, **slots: Any) -> builtins.list[dict[str, str]]:
        """Chat form of :meth:`render`: the prefix as the first (system) message, then ``user``."""
        prefix = self.get(name)
        out = render_messages(prefix, user, slots)
        self.record_use(name)
        return out

    def record_use(self, name: str, count: int = 1) -> None:
        """Count requests that used prefix ``name`` (clients report the prompts they rendered), at most
        ``MAX_USES_PER_REPORT`` at a time."""
        if not 0 <= count <= MAX_USES_PER_REPORT:
            raise InvalidInputError(f"count must be 0 to {MAX_USES_PER_REPORT}: report more uses in several calls", field="count")
        self.get(name)
        with self._lock:
            self._uses[name] = self._uses.get(name, 0) + count

    # ----- warming ------------------------------------------------------------------------------

    def warm_all(self, name: str) -> tuple[WarmResult, ...]:
        """Warm prefix ``name`` on every one of its endpoints now (target first)."""
        prefix = self.get(name)
        return tuple(self.warm(name, url) for url in self.endpoints_of(prefix))

    def warm(self, name: str, endpoint: str | None = None) -> WarmResult:
        """Warm prefix ``name`` on ``endpoint`` (default: its target) now, within the budget and the
        endpoint's back-off, and record the result."""
        prefix = self.get(name)
        url = prefix.target.base_url if endpoint is None else endpoint.rstrip("/")
        if url not in self.endpoints_of(prefix):
            raise InvalidInputError(f"prefix {name!r} is not served by {url!r}", field="endpoint")
        target = Target(url, prefix.target.model)

        def skipped(error: str) -> WarmResult:
            return WarmResult(prefix.name, prefix.version, WarmOutcome.SKIPPED, error=error, endpoint=url)

        with self._lock:
            state = self._state_for(prefix, url)
            if not self._health_of(url).may_try():
                return self._finish(state, skipped("target is backing off"))
            if not self._gate.try_spend():
                self._num_warms_deferred += 1
                return self._finish(state, skipped("warm budget for this minute is spent"))
            self._num_warms_sent += 1
            primed = state.primed
        head = template_head(prefix.text, prefix.is_template)
        try:
            usage = self._complete(target, head, prefix.form)
        except TargetUnavailableError as exc:
            with self._lock:
                health = self._health_of(url)
                health.record_failure(exc)
                delay = health.retry_at - self._clock()
                log.warning("warming %s on %s failed (%s); it backs off %.1fs", prefix.name, url, exc, delay)
                return self._finish(state, WarmResult(prefix.name, prefix.version, WarmOutcome.ERROR,
                                                      error=str(exc), endpoint=url))
        self._target_succeeded(url)
        if prefix.num_tokens is None and prefix.form is PromptForm.COMPLETION:
            self._fill_token_count(prefix, usage.num_prompt_tokens)
        if primed:
            resident = judge_residency(usage.num_prompt_tokens, usage.num_cached_tokens, self._block_size(target))
            outcome = WarmOutcome.RESIDENT if resident else WarmOutcome.EVICTED
        else:
            outcome = WarmOutcome.PRIME
        result = WarmResult(prefix.name, prefix.version, outcome, usage.num_prompt_tokens,
                            usage.num_cached_tokens, usage.latency_s, endpoint=url)
        if outcome is WarmOutcome.PRIME and prefix.lmcache_controller_url:
            self._lmcache_pin(prefix, target, head, state)
        with self._lock:
            state.primed = True
            state.held = False
            return self._finish(state, result)

    def _complete(self, target: Target, head: str, form: PromptForm) -> CompletionUsage:
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

    def _fill_token_count(self, prefix: Prefix, num_tokens: int) -> None:
        """Record the token count vLLM reported, for a prefix registered while it was down."""
        try:
            current = self._store.get(prefix.name)
        except TierUnavailableError:
            return  # the count stays unknown until the next warm; nothing else depends on it
        if current is not None and current.version == prefix.version and current.num_tokens is None:
            updated = dataclasses.replace(current, num_tokens=num_tokens)
            try:
                self._store.put(updated)
            except TierUnavailableError:
                return
            with self._lock:
                self._known[prefix.name] = updated

    def _finish(self, state: WarmState, result: WarmResult) -> WarmResult:
        """Count ``result`` and schedule the next warm (caller holds the lock)."""
        state.count(result.outcome, self._wall_clock())
        now = self._clock()
        if result.outcome in (WarmOutcome.PRIME, WarmOutcome.RESIDENT, WarmOutcome.EVICTED):
            gap_s = now - state.last_sent_at if state.last_sent_at is not None else state.schedule.interval_s
            state.schedule = next_schedule(state.schedule, result.outcome, gap_s, self.config)
            state.last_sent_at = now
        if result.outcome is WarmOutcome.SKIPPED:
            # Stay due: the warm goes out as soon as the budget or the back-off allows.
            state.next_due_at = min(state.next_due_at, self._clock())
        elif result.outcome is WarmOutcome.ERROR:
            state.next_due_at = self._health_of(state.base_url).retry_at
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

    # ----- targets ------------------------------------------------------------------------------

    def _health_of(self, url: str) -> TierHealth:
        health = self._health.get(url)
        if health is None:
            health = self._health[url] = TierHealth(backoff_initial_s=self.config.backoff_min_s,
                                                    backoff_max_s=self.config.backoff_max_s, clock=self._clock)
        return health

    def _block_size(self, target: Target) -> int:
        counters = self._counters.get(target.base_url)
        return (counters.block_size if counters else None) or self.config.default_block_size

    def _target_succeeded(self, url: str) -> None:
        """Mark ``url`` up; when it was down, its prefixes lost their KV cache and are re-primed now."""
        with self._lock:
            if self._health_of(url).record_success():
                log.info("target %s is back; re-warming its prefixes", url)
                self._reprime(url)

    def _reprime(self, url: str) -> None:
        now = self._clock()
        for (_name, base_url), state in self._states.items():
            if base_url == url:
                state.primed = False
                state.next_due_at = now

    def scrape(self, url: str) -> PrefixCacheCounters | None:
        """Read a target's prefix-cache counters; also a health probe (and restart detector)."""
        with self._lock:
            if not self._health_of(url).may_try():
                return None
        try:
            counters = self._vllm.prefix_cache_counters(url)
        except TargetUnavailableError as exc:
            with self._lock:
                self._health_of(url).record_failure(exc)
            log.warning("scraping %s failed: %s", url, exc)
            return None
        with self._lock:
            previous = self._counters.get(url)
            self._counters[url] = counters
            self._scraped_at[url] = self._clock()
            if previous is not None and counters.queries < previous.queries:
                # Counters went backwards: vLLM restarted between two looks, its cache is empty.
                log.info("target %s restarted; re-warming its prefixes", url)
                self._reprime(url)
        self._target_succeeded(url)
        return counters

    # ----- the keep-warm loop -------------------------------------------------------------------

    def _state_for(self, prefix: Prefix, url: str) -> WarmState:
        """The warm state of ``prefix``'s current version on ``url``; a new version starts afresh (caller locks)."""
        state = self._states.get((prefix.name, url))
        if state is None or state.version != prefix.version:
            state = WarmState(version=prefix.version, base_url=url,
                              schedule=Schedule(self.config.initial_rewarm_interval_s), next_due_at=self._clock())
            self._states[(prefix.name, url)] = state
        return state

    def _refresh(self) -> builtins.list[Prefix]:
        """The prefixes to consider this tick: from the store, or the last copy while it is down."""
        now = self._clock()
        if now - self._store_read_at >= self.config.store_refresh_interval_s:
            try:
                listed = self._store.list()
            except TierUnavailableError as exc:
                log.warning("prefix store unavailable, warming the last known list: %s", exc)
            else:
                with self._lock:
                    self._known = {p.name: p for p in listed}
                    live = {(p.name, url) for p in listed for url in self.endpoints_of(p)}
                    self._states = {key: s for key, s in self._states.items() if key in live}
                self._store_read_at = now
        with self._lock:
            return list(self._known.values())

    def tick(self) -> builtins.list[WarmResult]:
        """One pass of the loop: scrape endpoints that are due, warm the (prefix, endpoint) pairs that are
        due and that this replica holds the lease of."""
        prefixes = self._refresh()
        now = self._clock()
        for url in sorted({url for p in prefixes for url in self.endpoints_of(p)}):
            if now - self._scraped_at.get(url, float("-inf")) >= self.config.metrics_interval_s:
                self.scrape(url)
        pairs = [(p, url) for p in prefixes if p.pinned for url in self.endpoints_of(p)]
        # Every pair's lease is checked (and renewed) each tick, due or not: a holder that let its lease
        # lapse between two warms would hand its schedule to another replica and both would warm.
        held = [(p, url) for p, url in pairs if self._gate.holds(p.name, url)]
        due: list[tuple[float, str, str]] = []
        with self._lock:
            for prefix, url in held:
                state = self._state_for(prefix, url)
                if self._clock() >= state.next_due_at and self._health_of(url).may_try():
                    due.append((state.next_due_at, prefix.name, url))
        due = self._not_held_busy(due)
        # Longest-waiting first, so a spent budget delays every prefix fairly instead of starving
        # the ones that sort last.
        return [self.warm(name, url) for _, name, url in sorted(due)]

    def _not_held_busy(self, due: builtins.list[tuple[float, str, str]]) -> builtins.list[tuple[float, str, str]]:
        """The due warms that may go out now: those whose endpoint is not busy with users by its own /metrics
        (read fresh, once per endpoint), or that have waited ``warm_max_defer_s`` (see :func:`.policy.holds_warm`)."""
        if not due or (self.config.warm_max_waiting is None and self.config.warm_max_running is None):
            return due
        load = {url: self.scrape(url) for url in {url for _, _, url in due}}
        now = self._clock()
        ready = []
        with self._lock:
            for due_at, name, url in due:
                counters = load[url]
                running, waiting = (counters.num_running, counters.num_waiting) if counters else (None, None)
                state = self._states.get((name, url))
                if state is not None and holds_warm(running, waiting, now - due_at, self.config):
                    self._num_warms_held_busy += not state.held
                    state.held = True
                else:
                    ready.append((due_at, name, url))
        return ready

    def _run(self) -> None:
        while not self._stop.wait(self.config.tick_interval_s):
            try:
                self.tick()
            except Exception:  # the loop must survive anything; the next tick retries
                log.exception("prefix keep-warm tick failed")

    def start(self) -> None:
        """Start the keep-warm loop in a daemon thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ragcache-prefix-warmer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop and wait for it (a warm in flight finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.request_timeout_s + 5)
            self._thread = None
        self._vllm.close()

    # ----- stats --------------------------------------------------------------------------------

    def prefix_stats(self, name: str) -> PrefixStats:
        """Counters of prefix ``name`` in this process, summed and per endpoint."""
        prefix = self.get(name)
        with self._lock:
            return self._summary(prefix)

    def _summary(self, prefix: Prefix) -> PrefixStats:
        states = [self._state_for(prefix, url) for url in self.endpoints_of(prefix)]
        return summarize(prefix, states, self._uses.get(prefix.name, 0))

    def stats(self) -> RegistryStats:
        """Counters of every known prefix and endpoint (endpoints from their last scrape)."""
        with self._lock:
            prefixes = sorted(self._known.values(), key=lambda p: p.name)
            per_prefix = tuple(self._summary(p) for p in prefixes)
            urls = sorted({url for p in prefixes for url in self.endpoints_of(p)} | set(self._health))
            per_target = tuple(self._target_stats(url) for url in urls)
            return RegistryStats(per_prefix, per_target, self._num_warms_sent, self._num_warms_deferred,
                                 self._num_warms_held_busy)

    def _target_stats(self, url: str) -> TargetStats:
        health = self._health_of(url)
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


def _validate(spec: PrefixSpec) -> str:
    """Check a spec and return its constant head (the part that is warmed)."""
    check_name(spec.name)
    if not spec.target.base_url.startswith(("http://", "https://")):
        raise InvalidInputError("target base_url must be an http(s) URL", field="target.base_url")
    if not spec.target.model:
        raise InvalidInputError("target model must not be empty", field="target.model")
    if len(spec.endpoints) > MAX_ENDPOINTS:
        raise InvalidInputError(f"at most {MAX_ENDPOINTS} endpoints", field="endpoints")
    if not all(isinstance(url, str) and url.startswith(("http://", "https://")) for url in spec.endpoints):
        raise InvalidInputError("every endpoint must be an http(s) base URL", field="endpoints")
    head = template_head(spec.text, spec.is_template)
    if not head:
        raise InvalidInputError("the prefix (the text before the first slot) is empty", field="text")
    return head


def _flags_changed(existing: Prefix | None, spec: PrefixSpec) -> bool:
    """Whether a re-registration with the same content changes anything else that is stored."""
    return existing is None or (existing.pinned, existing.lmcache_controller_url, existing.endpoints) != (
        spec.pinned, spec.lmcache_controller_url, tuple(dict.fromkeys(spec.endpoints)))
