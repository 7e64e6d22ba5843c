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

A prefix is named by a string, or by a :class:`~.model.PrefixName` (a tenant's name and the one it is stored under,
``ragcache.retrieval.names``): errors and answers then carry the name the caller knows, never the stored one.

The registry is a facade: the prefixes themselves live in the store (:mod:`.known` keeps this process's last copy),
the schedules of keep-warm in :mod:`.warming` and its loop in :mod:`.loop`, which prefixes requests use in :mod:`.usage`,
keep-warm's residency views and stats in :mod:`.report`, the vLLM endpoints' health and counters in :mod:`.targets`.
"""

from __future__ import annotations

import builtins  # the class's own list() method shadows the builtin in its annotations
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import redis

from ragcache.engines import PrefixCacheCounters, TargetBadResponseError, TargetUnavailableError, VLLMClient
from ragcache.errors import InvalidInputError

from .allow import TargetPolicy
from .config import PrefixRegistryConfig
from .known import KnownPrefixes
from .lease import LocalWarmGate, RedisWarmGate, TenantBudgets, WarmGate
from .loop import KeepWarmLoop
from .model import MAX_USES_PER_REPORT, Prefix, PrefixName, PrefixSpec, Target, content_hash
from .quota import PrefixQuota
from .report import KeepWarmReport
from .results import PrefixView, RegisterResult, WarmResult
from .routing import Router, RouteResult
from .stats import PrefixStats, RegistryStats
from .store import PrefixStore, make_store
from .targets import Targets
from .text import find_volatile, render_messages, render_text, template_head
from .tokens import LocalTokenCounter
from .usage import PrefixUse

__all__ = ["PrefixRegistry"]

log = logging.getLogger(__name__)

TokenCounter = Callable[[Target, str], "int | None"]
# Replicas one prefix may name (each is warmed on its own schedule): a bound on the work one registration adds.
MAX_ENDPOINTS = 64


class PrefixRegistry:
    """Registered prefixes (in a shared store) plus this process's keep-warm loop and counters.

    Thread-safe: the HTTP app calls it from request threads while :meth:`start` runs the loop in a
    background thread.
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
        self._known = KnownPrefixes(store)
        self._vllm = vllm
        self._wall_clock = wall_clock
        self._token_counter = token_counter
        self._policy = TargetPolicy(self.config)
        self._quota = PrefixQuota(self.config, clock)
        self._clock = clock
        gate = gate or LocalWarmGate(TenantBudgets(self.config.warm_budget_per_minute,
                                                   self.config.warm_budget_per_tenant_per_minute, clock))
        self._targets = Targets(vllm, self.config, clock=clock)
        self._uses = PrefixUse(self.config, clock)
        self._keep_warm = keep_warm = KeepWarmLoop(self._known, self._targets, vllm, self.config, gate=gate, clock=clock,
                                   wall_clock=wall_clock, policy=self._policy, uses=self._uses)
        self._report = KeepWarmReport(keep_warm, keep_warm.engines, self._targets, self._uses)
        self._router = Router(keep_warm, keep_warm.engines, self._targets, self.config, clock)

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
                                 budget_per_tenant_per_minute=config.warm_budget_per_tenant_per_minute,
                                 lease_ttl_s=config.lease_ttl_s, key_prefix=config.redis_key)
        vllm = VLLMClient(http, timeout_s=config.request_timeout_s, read_timeout_s=config.read_timeout_s)
        return cls(store, vllm, config, token_counter=LocalTokenCounter(), gate=gate)

    # ----- registration -------------------------------------------------------------------------

    def register(self, spec: PrefixSpec, *, tenant: str | None = None) -> RegisterResult:
        """Store ``spec`` (a new version when its content changed) and warm it once if pinned; ``tenant``'s
        prefix is stored under ``<tenant>--<name>`` and answered under its own name.

        Succeeds even when vLLM is down: the warm then reports an error and the loop retries it. Over a bound
        (:mod:`.quota`: the text's size, the tenant's prefixes, its registrations this minute) it raises
        :class:`~.quota.PrefixLimitError` before anything is stored or contacted.
        """
        name = PrefixName.of(spec.name, tenant)
        self._quota.check_text(spec.text)
        spec = self._checked_urls(spec, tenant)
        head = _validate(spec)
        self._quota.take_registration(tenant)
        warnings = [span.message() for span in find_volatile(head)]
        digest = content_hash(spec.text, spec.target, spec.is_template, spec.form)
        existing = self._known.store.get(name.stored)
        if existing is None:
            self._quota.check_count(tenant, self._known.store.names())
        now = self._wall_clock()
        new_version = existing is None or existing.content_hash != digest
        num_tokens = self._count_tokens(spec.target, head) if new_version else existing.num_tokens  # type: ignore[union-attr]
        prefix = Prefix(
            name=name.stored,
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
        self._known.put(prefix)
        primed = self._keep_warm.all_primed(prefix)
        block_size = self._targets.block_size(prefix.target)
        if num_tokens is not None and num_tokens <= block_size:
            warnings.append(f"prefix has {num_tokens} tokens, not more than one KV block ({block_size}); "
                            "vLLM caches whole blocks only, so nothing of it is reused")
        warms: tuple[WarmResult, ...] = ()
        if prefix.pinned and (new_version or not primed):
            warms = self.warm_all(name)
        return RegisterResult(name.named(prefix), existing is None, new_version, tuple(warnings),
                              warms[0] if warms else None, warms)

    def _checked_urls(self, spec: PrefixSpec, tenant: str | None) -> PrefixSpec:
        """``spec`` with every URL it names canonical, each one checked against the operator's list for ``tenant``
        (:mod:`.allow`): nothing is stored, and nothing contacted, for a URL the operator did not allow."""
        if len(spec.endpoints) > MAX_ENDPOINTS:
            raise InvalidInputError(f"at most {MAX_ENDPOINTS} endpoints", field="endpoints")
        target = Target(self._policy.check(spec.target.base_url, tenant, "target.base_url"), spec.target.model)
        endpoints = tuple(self._policy.check(url, tenant, "endpoints") for url in spec.endpoints)
        lmcache = spec.lmcache_controller_url
        if lmcache is not None:
            lmcache = self._policy.check(lmcache, tenant, "lmcache_controller_url")
        return dataclasses.replace(spec, target=target, endpoints=endpoints, lmcache_controller_url=lmcache)

    def endpoints_of(self, prefix: Prefix) -> tuple[str, ...]:
        """The vLLM base URLs that keep ``prefix`` warm: its target first, then its replicas, then the
        deployment's list when its target is on it."""
        return self._keep_warm.endpoints_of(prefix)

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

    def get(self, name: str | PrefixName) -> Prefix:
        """The current version of prefix ``name``; :class:`NotFoundError` when there is none."""
        name = PrefixName.of(name)
        return name.named(self._known.get(name))

    def view(self, name: str | PrefixName) -> PrefixView:
        """Prefix ``name`` as :meth:`get` has it, with its residency on each endpoint by the engines' KV events."""
        name = PrefixName.of(name)
        prefix = self._known.get(name)
        fields = {field.name: getattr(prefix, field.name) for field in dataclasses.fields(Prefix)}
        return name.named(PrefixView(**fields, residency=self._report.residency_of(prefix)))

    def list(self) -> list[Prefix]:
        """Every registered prefix, by name."""
        return self._known.store.list()

    def delete(self, name: str | PrefixName) -> None:
        """Forget prefix ``name`` (it is no longer warmed); :class:`NotFoundError` when unknown."""
        name = PrefixName.of(name)
        self._known.delete(name)
        self._keep_warm.forget(name.stored)
        self._router.forget(name.stored)

    # ----- prompt building ----------------------------------------------------------------------

    def render(self, name: str | PrefixName, **slots: Any) -> str:
        """The prompt for prefix ``name``: its head byte for byte, then the slots filled in."""
        name = PrefixName.of(name)
        text = render_text(self.get(name), slots)
        self._uses.record_use(name.stored, 1)  # not record_use: it would read the prefix from the store again
        return text

    def messages(self, name: str | PrefixName, user: str, **slots: Any) -> builtins.list[dict[str, str]]:
        """Chat form of :meth:`render`: the prefix as the first (system) message, then ``user``."""
        name = PrefixName.of(name)
        out = render_messages(self.get(name), user, slots)
        self._uses.record_use(name.stored, 1)
        return out

    def record_use(self, name: str | PrefixName, count: int = 1) -> None:
        """Count requests that used prefix ``name`` (clients report the prompts they rendered), at most
        ``MAX_USES_PER_REPORT`` at a time."""
        name = PrefixName.of(name)
        if not 0 <= count <= MAX_USES_PER_REPORT:
            raise InvalidInputError(f"count must be 0 to {MAX_USES_PER_REPORT}: report more uses in several calls", field="count")
        self._known.get(name)
        self._uses.record_use(name.stored, count)

    # ----- keep-warm (:mod:`.warming`) ----------------------------------------------------------

    def warm_all(self, name: str | PrefixName) -> tuple[WarmResult, ...]:
        """Warm prefix ``name`` on every one of its endpoints now (target first)."""
        return self._keep_warm.warm_all(PrefixName.of(name))

    def warm(self, name: str | PrefixName, endpoint: str | None = None) -> WarmResult:
        """Warm prefix ``name`` on ``endpoint`` (default: its target) now, within the budget and the
        endpoint's back-off, and record the result."""
        return self._keep_warm.warm(PrefixName.of(name), endpoint)

    def route(self, name: str | PrefixName) -> RouteResult:
        """The endpoint a request on prefix ``name`` should go to (:mod:`.routing`), by the engines' KV events where
        they report, else by load, else in turn; the answer carries the caller's name."""
        name = PrefixName.of(name)
        prefix = self._known.get(name)
        self._uses.record_activity(prefix.name)
        result = self._router.route(prefix, self._known.copies())
        if result is None:
            raise InvalidInputError(f"prefix {name.public!r} has no endpoint this service may call", field="name")
        return name.named(result)

    def scrape(self, url: str) -> PrefixCacheCounters | None:
        """Read a target's prefix-cache counters; also a health probe (and restart detector)."""
        return self._keep_warm.scrape(url)

    def tick(self) -> builtins.list[WarmResult]:
        """One pass of the keep-warm loop (what :meth:`start` runs every ``tick_interval_s``)."""
        return self._keep_warm.tick()

    def start(self) -> None:
        """Start the keep-warm loop in a daemon thread (idempotent)."""
        self._keep_warm.start()

    def close(self) -> None:
        """Stop the loop and wait for it (a warm in flight finishes first)."""
        self._keep_warm.stop()
        self._vllm.close()

    # ----- stats --------------------------------------------------------------------------------

    def prefix_stats(self, name: str | PrefixName) -> PrefixStats:
        """Counters of prefix ``name`` in this process, summed and per endpoint."""
        name = PrefixName.of(name)
        return name.named(self._report.summary(self._known.get(name)))

    def stats(self) -> RegistryStats:
        """Counters of every known prefix and endpoint (endpoints from their last scrape)."""
        prefixes = self._known.copies()
        per_prefix = tuple(self._report.summary(p) for p in prefixes)
        per_target = self._targets.stats({url for p in prefixes for url in self.endpoints_of(p)})
        keep_warm = self._keep_warm
        return RegistryStats(per_prefix, per_target, keep_warm.num_warms_sent, keep_warm.num_warms_deferred,
                             keep_warm.num_warms_held_busy, keep_warm.num_warms_avoided, keep_warm.engines.stats(),
                             keep_warm.budget_per_minute)


def _validate(spec: PrefixSpec) -> str:
    """Check a spec (its name is checked as a ``PrefixName``, its URLs by ``_checked_urls``) and return its constant
    head (the part that is warmed)."""
    if not spec.target.model:
        raise InvalidInputError("target model must not be empty", field="target.model")
    head = template_head(spec.text, spec.is_template)
    if not head:
        raise InvalidInputError("the prefix (the text before the first slot) is empty", field="text")
    return head


def _flags_changed(existing: Prefix | None, spec: PrefixSpec) -> bool:
    """Whether a re-registration with the same content changes anything else that is stored."""
    return existing is None or (existing.pinned, existing.lmcache_controller_url, existing.endpoints) != (
        spec.pinned, spec.lmcache_controller_url, tuple(dict.fromkeys(spec.endpoints)))
