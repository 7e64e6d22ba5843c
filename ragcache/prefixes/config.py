"""Configuration of the KV-prefix registry: one frozen dataclass, every field with its unit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ragcache.engines import EventsConfig
from ragcache.errors import ConfigError, InvalidInputError
from ragcache.outbound import canonical_url

__all__ = ["PrefixRegistryConfig"]


@dataclass(frozen=True)
class PrefixRegistryConfig:
    """Knobs of the registry and its keep-warm loop.

    The re-warm interval of each prefix adapts between ``min_rewarm_interval_s`` and
    ``max_rewarm_interval_s``: it shrinks by ``shrink_factor`` after a warm finds the prefix evicted and
    grows by ``grow_factor`` while warms keep finding it resident, staying below the shortest gap that
    has seen an eviction (see :func:`ragcache.prefixes.policy.next_schedule`). ``warm_budget_per_minute`` caps the
    warm requests this process sends to vLLM in any minute (a token bucket), whatever the intervals say.
    """

    initial_rewarm_interval_s: float = 10.0
    min_rewarm_interval_s: float = 1.0
    max_rewarm_interval_s: float = 120.0
    shrink_factor: float = 0.5
    grow_factor: float = 1.5
    ceiling_relax_factor: float = 1.02
    warm_budget_per_minute: int = 120
    # A target that fails is retried after a back-off that doubles from min to max.
    backoff_min_s: float = 1.0
    backoff_max_s: float = 30.0
    # How often the loop wakes up, and how often it scrapes each target's /metrics.
    tick_interval_s: float = 0.25
    metrics_interval_s: float = 5.0
    # How often the loop re-reads the shared store (to pick up other replicas' registrations).
    store_refresh_interval_s: float = 2.0
    # A warm's deadline (its prefill may wait behind the engine's users), and a read's (/metrics, /tokenize). Each
    # endpoint's calls run in its own thread with its own connections: a hung replica costs only its own prefixes.
    request_timeout_s: float = 30.0
    read_timeout_s: float = 5.0
    # Used to judge residency until a target's /metrics has told us its real block size.
    default_block_size: int = 16
    # Local JSON file that holds the registry when no Redis client is given.
    file_path: Path = Path("data/prefixes.json")
    redis_key: str = "rc:prefixes"
    # The deployment's vLLM replicas (base URLs): a prefix whose target is one of them is kept warm on all.
    endpoints: tuple[str, ...] = ()
    # How long a replica's lease on a (prefix, endpoint) outlives it (with a shared Redis): another replica
    # takes the warming over at most this long after the holder died.
    lease_ttl_s: float = 10.0
    # Warms must not cost users TTFT. Each warm carries this vLLM request priority: a larger value is served
    # later, so a server started with `--scheduling-policy priority` schedules every waiting user request
    # (priority 0 by default) before a warm and preempts warms first when KV blocks run short; an FCFS server
    # ignores the field (one that refuses it gets the warm again without it). None: no priority field.
    warm_priority: int | None = 1_000_000
    # A due warm is held back while its endpoint's /metrics reports more than warm_max_waiting requests
    # waiting or more than warm_max_running running (None: no limit), checked each tick, for at most
    # warm_max_defer_s; then it goes out anyway (at warm_priority), so a prefix on an endpoint that is never
    # idle is still kept. The default holds warms while users queue: a server with a queue has no room.
    warm_max_waiting: int | None = 0
    warm_max_running: int | None = None
    warm_max_defer_s: float = 5.0
    # LMCache controller pin target (see LMCache's controller `/pin` API).
    lmcache_instance_id: str = "lmcache_default_instance"
    lmcache_location: str = "LocalCPUBackend"
    # Which URLs a prefix may name (:mod:`.allow`): with restrict_targets, only ``endpoints``, ``allowed_targets``
    # and the prefix's tenant's ``tenant_targets``; without it (the library's default: an in-process caller is the
    # operator), any plain http(s) URL. URLs with credentials, a query or a fragment are refused either way.
    restrict_targets: bool = False
    allowed_targets: tuple[str, ...] = ()
    tenant_targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Bounds on what one tenant stores (:mod:`.quota`): UTF-8 bytes of one prefix's text, prefixes per tenant (the
    # keys without a tenant count as one), and registrations per tenant in any minute (per replica).
    max_text_bytes: int = 256 * 1024
    max_prefixes_per_tenant: int = 100
    registrations_per_minute: int = 60
    # Warms one tenant's prefixes may take in any minute, within warm_budget_per_minute (:mod:`.lease`): one tenant's
    # many prefixes spend its own share, never another tenant's. The keys without a tenant share one.
    warm_budget_per_tenant_per_minute: int = 60
    # The budget follows use (issue 42, item 5): a prefix no request used (a use reported, a route asked) for
    # idle_after_s is idle, and its warm goes out only while more than idle_budget_share of this minute's budget (the
    # fleet's and its tenant's) is left; prefixes in use are warmed first and may spend it all.
    idle_after_s: float = 60.0
    idle_budget_share: float = 0.5
    # The budget sized from the engines' own figures (:mod:`.budget`), on by default: each tick, what keeping every
    # pinned prefix warm takes at the rate each engine's KV cache turns over, twice over, within
    # [warm_budget_min_per_minute, warm_budget_per_minute]; until the engines report their figures, and when off,
    # warm_budget_per_minute, fixed. A quiet fleet's budget is small: a timer schedule faster than its engines' turnover
    # (the 1 s one of tests/vllm/test_prefix_fleet_vllm.py's take-over) is held to it, which is the point.
    warm_budget_sized: bool = True
    warm_budget_min_per_minute: int = 12
    # vLLM endpoints that publish KV events (--kv-events-config), by base URL: their prefixes' residency is read from
    # the engine (:mod:`.engine_view`), a warm goes out when the prefix's blocks are removed, and a due timer warm is
    # not sent while the events show the prefix whole. Other endpoints keep the warm-measured schedule.
    kv_events: Mapping[str, EventsConfig] = field(default_factory=dict)
    # A prefix the events show evicted within unkeepable_within_s of its warm, unkeepable_after times in a row, is
    # reported not keepable there (churn evicts it faster than it can be re-warmed): no warm is sent for it on that
    # endpoint for unkeepable_retry_s, then one is tried again.
    unkeepable_within_s: float = 1.0
    unkeepable_after: int = 3
    unkeepable_retry_s: float = 60.0
    # A route that sent a prefix where it was not resident counts as placing it there for this long, or until the
    # events show its blocks: the requests routed meanwhile follow the first instead of loading it somewhere else too.
    route_pending_s: float = 5.0
    # An eviction the events show wakes the loop at once (the warm goes out within one warm's time), not at its next
    # tick. Off only for tests that drive the loop tick by tick.
    warm_on_event: bool = True
    # What the events claim is checked by real warms (:mod:`.trust`): one goes out on an endpoint verify_interval_s
    # after its last warm even while its events show the prefix whole; events that claim blocks untrust_after such
    # warms in a row did not find are ignored for untrusted_s.
    verify_interval_s: float = 10.0
    untrust_after: int = 2
    untrusted_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.min_rewarm_interval_s <= self.max_rewarm_interval_s:
            raise ConfigError("need 0 < min_rewarm_interval_s <= max_rewarm_interval_s")
        if not 0 < self.shrink_factor <= 1 <= self.grow_factor or self.ceiling_relax_factor < 1:
            raise ConfigError("need 0 < shrink_factor <= 1 <= grow_factor and ceiling_relax_factor >= 1")
        if min(self.warm_budget_per_minute, self.warm_budget_per_tenant_per_minute, self.warm_budget_min_per_minute) < 1:
            raise ConfigError("warm_budget_per_minute, warm_budget_per_tenant_per_minute and warm_budget_min_per_minute "
                              "must be at least 1")
        if min(self.max_text_bytes, self.max_prefixes_per_tenant, self.registrations_per_minute) < 1:
            raise ConfigError("max_text_bytes, max_prefixes_per_tenant and registrations_per_minute must be at least 1")
        if not 0 < self.backoff_min_s <= self.backoff_max_s:
            raise ConfigError("need 0 < backoff_min_s <= backoff_max_s")
        if self.lease_ttl_s <= 0:
            raise ConfigError("lease_ttl_s must be positive")
        if min(self.warm_max_waiting or 0, self.warm_max_running or 0) < 0 or self.warm_max_defer_s < 0:
            raise ConfigError("warm_max_waiting, warm_max_running and warm_max_defer_s must not be negative")
        try:
            endpoints = tuple(canonical_url(url, "endpoints") for url in self.endpoints)
        except InvalidInputError as exc:
            raise ConfigError(f"endpoints: every one must be a plain http(s) base URL ({exc})") from None
        object.__setattr__(self, "endpoints", endpoints)
        try:
            events = {canonical_url(url, "kv_events"): config for url, config in self.kv_events.items()}
        except InvalidInputError as exc:
            raise ConfigError(f"kv_events: every key must be a plain http(s) base URL ({exc})") from None
        object.__setattr__(self, "kv_events", events)
        if self.idle_after_s <= 0 or not 0 <= self.idle_budget_share < 1:
            raise ConfigError("need idle_after_s > 0 and 0 <= idle_budget_share < 1")
        if min(self.request_timeout_s, self.read_timeout_s, self.verify_interval_s) <= 0 or self.untrust_after < 1:
            raise ConfigError("request_timeout_s, read_timeout_s and verify_interval_s must be positive, untrust_after >= 1")
        if self.tick_interval_s <= 0 or self.default_block_size < 1:
            raise ConfigError("tick_interval_s and default_block_size must be positive")
