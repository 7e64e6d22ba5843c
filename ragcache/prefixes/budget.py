"""The warm budget sized from the engines' own figures (issue 42, item 5).

A pinned prefix can lose its blocks at most once per turnover of its engine's KV cache: the time the engine takes to
write as many new blocks as its cache holds. Both figures are the engine's own, from its ``/metrics``: the cache's
size (``vllm:cache_config_info``'s ``num_gpu_blocks`` x ``block_size`` tokens) and the tokens it computed rather than
found cached (``vllm:prefix_cache_queries_total`` - ``vllm:prefix_cache_hits_total``), between two scrapes
(:meth:`.targets.Targets.turnover_s`). So keeping every pinned (prefix, endpoint) pair warm takes one warm per
turnover of its endpoint, plus one for each pair not yet primed, plus the warms that check each endpoint's events (one
per ``verify_interval_s``); the budget is that need times ``HEADROOM`` (warms that find the prefix still whole, a
turnover faster than the last two scrapes showed), at least ``warm_budget_min_per_minute``
and at most ``warm_budget_per_minute``, the operator's promise to vLLM. While an endpoint with pinned prefixes has not
reported both figures yet, the budget is that ceiling, as when sizing is off.

Example: the ``bench kv`` engine (8,192 tokens of KV cache) under 4,000 computed tokens/s turns over every 2.05 s (8,192 / 4,000 = 2.048):
one pinned prefix there needs 29.3 warms a minute and the events' checks 6, and the budget is 71.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["HEADROOM", "sized_budget"]

HEADROOM = 2.0


def sized_budget(pairs: Iterable[tuple[float | None, bool]], *, floor: int, ceiling: int,
                 checks_per_minute: float = 0.0) -> int:
    """Warms a minute for the pinned (prefix, endpoint) ``pairs``, each given as (its endpoint's turnover in seconds,
    None when not known yet; whether the pair was primed), and ``checks_per_minute`` (the warms that check the
    endpoints' events, :mod:`.trust`), within [``floor``, ``ceiling``]."""
    need = checks_per_minute
    for turnover_s, primed in pairs:
        if turnover_s is None:
            return ceiling  # an engine that has not reported its figures: nothing to size the budget by
        need += (60.0 / turnover_s if turnover_s > 0 else 0.0) + (0 if primed else 1)
    return max(floor, min(ceiling, math.ceil(HEADROOM * need)))
