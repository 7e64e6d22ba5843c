"""The registry's counters, as ``/stats`` shows them: per prefix and endpoint, per vLLM target, per KV-event feed."""

from __future__ import annotations

from dataclasses import dataclass

from .results import WarmOutcome

__all__ = ["EndpointStats", "EventsStats", "PrefixStats", "RegistryStats", "TargetStats"]


@dataclass(frozen=True)
class EndpointStats:
    """One prefix on one vLLM endpoint, as this process's warms found it."""

    base_url: str
    # As the last judged warm found it: True resident, False evicted (and loaded again by that warm);
    # None before a re-warm has been judged.
    resident: bool | None
    last_outcome: WarmOutcome | None
    last_warm_at: float | None
    num_warms: int
    num_resident: int
    num_evicted: int
    num_errors: int
    num_skipped: int
    residency_rate: float | None
    rewarm_interval_s: float
    # By the engine's KV events (issue 30): "synced" (exact), "out_of_sync" (unknown now), "off" (none published);
    # the prefix's full blocks and how many of them the endpoint holds, when synced and known.
    events: str = "off"
    resident_blocks: int | None = None
    num_blocks: int | None = None
    # False while churn evicts the prefix faster than it can be re-warmed (no warm is sent for it then).
    keepable: bool = True
    num_warms_avoided: int = 0
    # Why the engine cannot keep it, each with the figure that shows it (:mod:`.reasons`).
    why_not_cached: tuple[str, ...] = ()


@dataclass(frozen=True)
class PrefixStats:
    """Per-prefix counters of this process."""

    name: str
    version: int
    num_tokens: int | None
    pinned: bool
    num_warms: int
    num_resident: int
    num_evicted: int
    num_errors: int
    num_skipped: int
    # Resident warms / (resident + evicted) warms; None until a re-warm has been judged.
    residency_rate: float | None
    last_outcome: WarmOutcome | None
    last_warm_at: float | None
    rewarm_interval_s: float
    num_uses: int
    # Tokens an LMCache controller reported pinned for this version; None without a controller.
    lmcache_pinned_tokens: int | None = None
    # Per vLLM endpoint (the target first); the counters above are their sums.
    endpoints: tuple[EndpointStats, ...] = ()


@dataclass(frozen=True)
class TargetStats:
    """Health and prefix-cache counters of one vLLM target, as last scraped from its /metrics."""

    base_url: str
    up: bool
    num_failures: int
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    # hits / queries of vLLM's own counters (tokens); None before any query.
    prefix_cache_hit_rate: float | None
    block_size: int | None


@dataclass(frozen=True)
class EventsStats:
    """One endpoint's KV-event feed as this process sees it (:mod:`.trust`): ``state`` is ``synced``, ``syncing``,
    ``out_of_sync`` or ``untrusted``; the warms that checked what its events claimed, those that did not find it, and
    the publishers that came back with another stream (each clearing its index)."""

    base_url: str
    state: str
    trusted: bool
    num_checks: int
    num_disagreements: int
    num_new_streams: int


@dataclass(frozen=True)
class RegistryStats:
    """Everything `/stats` shows about prefixes."""

    prefixes: tuple[PrefixStats, ...]
    targets: tuple[TargetStats, ...]
    num_warms_sent: int
    num_warms_deferred: int
    # Due warms held back while their endpoint reported users waiting or running (warm_max_waiting/_running).
    num_warms_held_busy: int = 0
    # Due timer warms not sent because the engine's KV events showed the prefix whole.
    num_warms_avoided: int = 0
    # Each endpoint that publishes KV events.
    events: tuple[EventsStats, ...] = ()
    # The fleet's warm budget a minute as sized from the engines' figures (:mod:`.budget`); None: the configured one.
    warm_budget_per_minute: int | None = None
