"""Which replica a request on a prefix should go to (issue 30, ``POST /prefixes/{name}/route``): the one holding most
of the prefix's blocks by the engines' KV events, the least loaded among equals; where no endpoint reports residency,
the least loaded by its last /metrics; where none reports load either, the next in turn. Endpoints whose breaker is
open are left out while any other is up."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RouteCandidate", "RouteResult", "choose_route", "RoundRobin"]


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
    # KV blocks the endpoint holds in all, by its events (None without them): where the prefix is nowhere, the one
    # holding the fewest has the most room, so warming it there costs least.
    held_blocks: int | None = None


@dataclass(frozen=True)
class RouteResult:
    """Where to send a request that starts with prefix ``name``, and why (``resident``: it holds most of the prefix;
    ``least_load``: no replica holds more of it than another, this one is the least busy; ``least_cost``: as busy as
    the others, it holds the fewest blocks, so loading the prefix there evicts least; ``round_robin``: nothing known,
    the next in turn)."""

    name: str
    endpoint: str
    reason: str
    candidates: tuple[RouteCandidate, ...]


class RoundRobin:
    """A turn per prefix, for when nothing else tells endpoints apart (thread-safe)."""

    def __init__(self) -> None:
        self._turns: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def next(self, name: str) -> int:
        with self._lock:
            return next(self._turns.setdefault(name, itertools.count()))


def choose_route(name: str, candidates: Sequence[RouteCandidate], turn: int) -> RouteResult:
    """The endpoint for a request on prefix ``name`` (``candidates`` in the prefix's endpoint order, target first)."""
    pool = [c for c in candidates if c.up] or list(candidates)
    known = [c for c in pool if c.resident_blocks is not None]
    if known:
        best = max(known, key=lambda c: (c.resident_blocks or 0, -(c.load if c.load is not None else float("inf"))))
        if (best.resident_blocks or 0) > 0:
            return RouteResult(name, best.base_url, "resident", tuple(candidates))
    loaded = [c for c in pool if c.load is not None]
    if loaded:
        least = min(loaded, key=lambda c: c.load or 0.0)
        if any(c.load != least.load for c in loaded):
            return RouteResult(name, least.base_url, "least_load", tuple(candidates))
        pool = [c for c in pool if c.load == least.load]
    held = [c for c in pool if c.held_blocks is not None]
    if held:
        roomiest = min(held, key=lambda c: c.held_blocks or 0)
        if any(c.held_blocks != roomiest.held_blocks for c in held):
            return RouteResult(name, roomiest.base_url, "least_cost", tuple(candidates))
    return RouteResult(name, pool[turn % len(pool)].base_url, "round_robin", tuple(candidates))
