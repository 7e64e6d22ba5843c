"""What keep-warm reports (:class:`KeepWarmReport`): each prefix's residency per endpoint by the engines' events, and its
counters summed and per endpoint with why an endpoint does not keep it cached. It reads copies of the warm states
(:meth:`.warming.KeepWarm.states_of`), so a report never holds the schedule's lock while it asks the engines' views."""

from __future__ import annotations

import dataclasses

from .engine_view import EngineView
from .model import Prefix, Target
from .reasons import why_not_cached
from .results import EndpointResidency
from .state import WarmState, summarize
from .stats import EndpointStats, PrefixStats
from .targets import Targets
from .text import template_head
from .usage import PrefixUse
from .warming import KeepWarm

__all__ = ["KeepWarmReport"]


class KeepWarmReport:
    """Residency views and stats of the prefixes that ``keep_warm`` schedules (thread-safe: it keeps no state)."""

    def __init__(self, keep_warm: KeepWarm, engines: EngineView, targets: Targets, uses: PrefixUse) -> None:
        self._keep_warm = keep_warm
        self._engines = engines
        self._targets = targets
        self._uses = uses

    def residency_of(self, prefix: Prefix) -> tuple[EndpointResidency, ...]:
        """The prefix's residency on each of its endpoints (the target first), by the engines' events."""
        out = []
        for state in self._keep_warm.states_of(prefix):
            view = self._engines.view(prefix, state.base_url)
            out.append(EndpointResidency(state.base_url, view.events, view.resident_blocks, view.num_blocks,
                                         state.not_keepable_until is None))
        return tuple(out)

    def summary(self, prefix: Prefix) -> PrefixStats:
        """Counters of ``prefix`` in this process, summed and per endpoint."""
        states = self._keep_warm.states_of(prefix)
        stats = summarize(prefix, states, self._uses.num_uses(prefix.name))
        endpoints = tuple(self._with_residency(prefix, state, snapshot) for state, snapshot in zip(states, stats.endpoints))
        return dataclasses.replace(stats, endpoints=endpoints)

    def _with_residency(self, prefix: Prefix, state: WarmState, snapshot: EndpointStats) -> EndpointStats:
        """An endpoint's stats with what the engine's events say and why it cannot keep the prefix."""
        view = self._engines.view(prefix, state.base_url)
        counters = self._targets.counters_of(state.base_url)
        block_size = self._targets.block_size(Target(state.base_url, prefix.target.model))
        reasons = why_not_cached(template_head(prefix.text, prefix.is_template), prefix.num_tokens, block_size, counters,
                                 view, state, self._uses.idle_s(prefix.name))
        return dataclasses.replace(snapshot, events=view.events, resident_blocks=view.resident_blocks,
                                   num_blocks=view.num_blocks, keepable=state.not_keepable_until is None,
                                   num_warms_avoided=state.num_warms_avoided, why_not_cached=reasons)
