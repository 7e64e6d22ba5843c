"""Which replica a request on a prefix should go to (issue 30, ``POST /prefixes/{name}/route``).

By the engines' KV events, in this order:

1. ``resident``: a replica that holds (or was just sent, :class:`Placements`) the prefix and has room for it beside the
   other registered prefixes it holds; the one holding most of it, the least loaded among equals.
2. ``least_cost``: the prefix is held only where it does not fit beside the other prefixes there (they would evict one
   another at every request), or nowhere: the replica where it fits, holding the fewest blocks of other prefixes, the
   least loaded among equals. So two prefixes that do not fit on one replica are kept on two.
3. ``resident`` again where it fits nowhere: the replica holding most of it.
4. Without events: ``least_load`` by the last /metrics; where none tells the replicas apart, ``round_robin``.

Endpoints whose breaker is open are left out while any other is up.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .config import PrefixRegistryConfig
from .engine_view import EngineView
from .model import Prefix
from .targets import Targets
from .warming import KeepWarm

__all__ = ["RouteCandidate", "RouteResult", "Router", "choose_route", "RoundRobin", "Placements"]


@dataclass(frozen=True)
class RouteCandidate:
    """One endpoint as the route saw it."""

    base_url: str
    up: bool
    events: str
    resident_blocks: int | None
    num_blocks: int | None
    # Requests running plus waiting by its last /metrics; None before one answered.
    load: float | None
    # KV blocks the endpoint holds in all, by its events (None without them): where the prefix is nowhere and nothing
    # else tells the replicas apart, the one holding the fewest has the most room.
    held_blocks: int | None = None
    # Blocks of the other registered prefixes the endpoint holds, by its events (None without them).
    other_prefix_blocks: int | None = None
    # The KV cache's blocks (vllm:cache_config_info num_gpu_blocks; None before a scrape read it).
    capacity_blocks: int | None = None
    # A route sent the prefix here within route_pending_s, and the events do not show it yet.
    pending: bool = False

    @property
    def holds(self) -> int:
        """Blocks of the prefix it holds, counting a pending placement as whole."""
        if self.pending and self.num_blocks is not None:
            return max(self.num_blocks, self.resident_blocks or 0)
        return self.resident_blocks or 0

    @property
    def fits(self) -> bool:
        """Whether the prefix fits in its KV cache beside the other prefixes it holds (true when a figure is missing).
        The traffic's own blocks are not counted: they are evicted first, being the least recently used."""
        if self.capacity_blocks is None or self.num_blocks is None or self.other_prefix_blocks is None:
            return True
        return self.other_prefix_blocks + self.num_blocks <= self.capacity_blocks


@dataclass(frozen=True)
class RouteResult:
    """Where to send a request that starts with prefix ``name``, and why (``resident``: it holds most of the prefix;
    ``least_cost``: the prefix is held nowhere it fits, this replica has room for it; ``least_load``: no replica
    reports residency, this one is the least busy; ``round_robin``: nothing known, the next in turn)."""

    name: str
    endpoint: str
    reason: str
    candidates: tuple[RouteCandidate, ...]

    def brief(self) -> RouteResult:
        """The endpoint and the reason only: what a tenant's key is answered (issue 38, item 10). The candidates'
        figures are the fleet's, not the tenant's: the blocks of every other tenant's prefixes coming and going,
        each engine's total blocks and load."""
        return RouteResult(self.name, self.endpoint, self.reason, ())


class RoundRobin:
    """A turn per prefix, for when nothing else tells endpoints apart (thread-safe)."""

    def __init__(self) -> None:
        self._turns: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def next(self, name: str) -> int:
        with self._lock:
            return next(self._turns.setdefault(name, itertools.count()))


class Placements:
    """Where routes recently sent a prefix that was not resident there (thread-safe): its blocks appear in the events
    only once the first request's prefill is done, and the requests routed meanwhile should follow it."""

    def __init__(self) -> None:
        self._until: dict[tuple[str, str], float] = {}  # (prefix, endpoint) -> monotonic time the placement lapses
        self._lock = threading.Lock()

    def place(self, name: str, url: str, until: float) -> None:
        with self._lock:
            self._until[(name, url)] = until

    def pending(self, name: str, url: str, now: float) -> bool:
        with self._lock:
            until = self._until.get((name, url))
            if until is not None and until <= now:
                del self._until[(name, url)]
                return False
            return until is not None

    def settle(self, name: str, url: str) -> None:
        """The events show the prefix there: the placement is done."""
        with self._lock:
            self._until.pop((name, url), None)

    def forget(self, name: str) -> None:
        with self._lock:
            self._until = {key: until for key, until in self._until.items() if key[0] != name}


def _load(c: RouteCandidate) -> float:
    return c.load if c.load is not None else float("inf")


def _held(c: RouteCandidate) -> float:
    return c.held_blocks if c.held_blocks is not None else float("inf")


def choose_route(name: str, candidates: Sequence[RouteCandidate], turn: int) -> RouteResult:
    """The endpoint for a request on prefix ``name`` (``candidates`` in the prefix's endpoint order, target first)."""
    pool = [c for c in candidates if c.up] or list(candidates)

    def result(chosen: RouteCandidate, reason: str) -> RouteResult:
        return RouteResult(name, chosen.base_url, reason, tuple(candidates))

    known = [c for c in pool if c.resident_blocks is not None or c.pending]
    if known:
        holding = [c for c in known if c.holds > 0]
        fitting = [c for c in holding if c.fits]
        if fitting:
            return result(max(fitting, key=lambda c: (c.holds, -_load(c))), "resident")
        # Every replica that has room, with events or not (one without counts as holding no other prefix), so a
        # mixed fleet does not send every new prefix to the replicas that publish.
        room = [c for c in pool if c.fits]
        if room:
            return result(min(room, key=lambda c: (c.other_prefix_blocks or 0, _load(c), _held(c))), "least_cost")
        if holding:
            return result(max(holding, key=lambda c: (c.holds, -_load(c))), "resident")
    loaded = [c for c in pool if c.load is not None]
    if loaded:
        least = min(loaded, key=_load)
        if any(c.load != least.load for c in loaded):
            return result(least, "least_load")
        pool = [c for c in pool if c.load == least.load]
    held = [c for c in pool if c.held_blocks is not None]
    if held:
        roomiest = min(held, key=lambda c: c.held_blocks or 0)
        if any(c.held_blocks != roomiest.held_blocks for c in held):
            return result(roomiest, "least_cost")
    return result(pool[turn % len(pool)], "round_robin")


class Router:
    """The routes of requests on prefixes: each endpoint as a route sees it (its residency and room by the engine's
    events, its load and KV cache's size by its last /metrics, its health, a recent placement), then
    :func:`choose_route` (thread-safe)."""

    def __init__(self, keep_warm: KeepWarm, engines: EngineView, targets: Targets, config: PrefixRegistryConfig,
                 clock: Callable[[], float]) -> None:
        self._keep_warm = keep_warm  # only for each prefix's endpoints
        self._engines = engines
        self._targets = targets
        self._config = config
        self._clock = clock
        self._turns = RoundRobin()
        self._placements = Placements()

    def route(self, prefix: Prefix, prefixes: Sequence[Prefix]) -> RouteResult | None:
        """Where a request on ``prefix`` goes, among ``prefixes`` (every one known); None when it has no endpoint."""
        now = self._clock()
        others = [p for p in prefixes if p.name != prefix.name]
        candidates = [self._candidate(prefix, url, others, now) for url in self._keep_warm.endpoints_of(prefix)]
        if not candidates:
            return None
        result = choose_route(prefix.name, candidates, self._turns.next(prefix.name))
        chosen = next(c for c in candidates if c.base_url == result.endpoint)
        # Sent where it is not whole (yet): the requests routed before its blocks show there follow this one.
        if chosen.events == "synced" and not chosen.pending and (chosen.resident_blocks or 0) < (chosen.num_blocks or 1):
            self._placements.place(prefix.name, chosen.base_url, now + self._config.route_pending_s)
        return result

    def forget(self, name: str) -> None:
        self._placements.forget(name)

    def _candidate(self, prefix: Prefix, url: str, others: list[Prefix], now: float) -> RouteCandidate:
        view = self._engines.view(prefix, url)
        if view.fully_resident:
            self._placements.settle(prefix.name, url)
        counters = self._targets.counters_of(url)
        load = None
        if counters is not None and counters.num_running is not None and counters.num_waiting is not None:
            load = counters.num_running + counters.num_waiting
        # Only a synced feed whose events are believed places anything: while an endpoint syncs (a restarted engine's
        # index being rebuilt) or is untrusted, nothing there counts as resident, a recent placement included.
        synced = view.events == "synced"
        return RouteCandidate(
            url, not self._targets.health_of(url).is_down, view.events, view.resident_blocks, view.num_blocks, load,
            held_blocks=self._engines.held_blocks(url),
            other_prefix_blocks=self._other_prefix_blocks(others, url, now) if synced else None,
            capacity_blocks=counters.num_gpu_blocks if counters is not None else None,
            pending=synced and self._placements.pending(prefix.name, url, now))

    def _other_prefix_blocks(self, others: list[Prefix], url: str, now: float) -> int:
        """Blocks of the prefixes in ``others`` that ``url`` holds by its events, a pending placement counted whole."""
        total = 0
        for other in others:
            if url not in self._keep_warm.endpoints_of(other):
                continue
            view = self._engines.view(other, url)
            held = view.resident_blocks or 0
            if view.num_blocks is not None and self._placements.pending(other.name, url, now):
                held = max(held, view.num_blocks)
            total += held
        return total
