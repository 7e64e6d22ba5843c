"""Why an engine cannot keep a prefix cached (issue 30): each reason with the figure that shows it, from what the
registry knows of the prefix (its head, its tokens), of the endpoint (its /metrics) and of the prefix there (its warms,
the engine's KV events). Reasons are facts found, not guesses: one without its figure is not given."""

from __future__ import annotations

from ragcache.engines import PrefixCacheCounters

from .engine_view import ResidencyView
from .state import WarmState
from .text import find_volatile

__all__ = ["why_not_cached"]

# Re-warms that all found nothing cached, on an endpoint with prefix caching on and no churn reported: the engine's
# cache does not reuse this model's prefixes (a hybrid or Mamba model whose cache is a no-op).
NUM_NEVER_REUSED = 3


def why_not_cached(head: str, num_tokens: int | None, block_size: int, counters: PrefixCacheCounters | None,
                   view: ResidencyView, state: WarmState, idle_s: float | None = None) -> tuple[str, ...]:
    """The reasons, most basic first; empty when nothing stands in the way. ``idle_s``: for how long no request used
    the prefix (None while in use)."""
    reasons: list[str] = []
    if counters is not None and counters.prefix_caching is False:
        reasons.append("prefix caching is off on this endpoint (vllm:cache_config_info enable_prefix_caching=False)")
    if num_tokens is not None and num_tokens <= block_size:
        reasons.append(f"the prefix has {num_tokens} tokens, not more than one KV block of {block_size}: "
                       "vLLM caches whole blocks only")
    reasons += [f"{span.message()}: requests differ from there on, so nothing after it is shared"
                for span in find_volatile(head)]
    prefix_blocks = view.num_blocks if view.num_blocks is not None else (
        num_tokens // block_size if num_tokens is not None else None)
    if counters is not None and counters.num_gpu_blocks is not None and prefix_blocks is not None:
        if prefix_blocks > counters.num_gpu_blocks:
            reasons.append(f"the KV cache holds {counters.num_gpu_blocks} blocks, the prefix alone needs {prefix_blocks}")
        elif state.not_keepable_until is not None:
            reasons.append(f"the KV cache ({counters.num_gpu_blocks} blocks of {block_size} tokens) is too small for "
                           f"the prefix ({prefix_blocks} blocks) plus the traffic")
    if state.not_keepable_until is not None and state.quickest_eviction_s is not None:
        reasons.append(f"churn evicts it within {state.quickest_eviction_s:.2f} s of a warm ({state.num_quick_evictions} "
                       "times in a row): not keepable, warms stopped for a while")
    if view.events == "untrusted":
        reasons.append("the endpoint's KV events claimed blocks that warms did not find: they are not believed for a "
                       "while (untrusted; residency from warms meanwhile)")
    if idle_s is not None and state.idle_deferred:
        reasons.append(f"no request used it for {idle_s:.0f} s: an idle prefix is kept warm only while the warm budget "
                       f"has room ({state.num_idle_deferred} of its warms waited for room)")
    caching_on = counters is None or counters.prefix_caching is not False
    if caching_on and state.num_resident == 0 and state.num_evicted >= NUM_NEVER_REUSED and state.not_keepable_until is None:
        if view.fully_resident:  # the events say the engine holds every block: churn did not take them
            reasons.append(f"every re-warm found nothing cached ({state.num_evicted} of {state.num_evicted}) while the "
                           f"engine's events show all {view.num_blocks} of its blocks held: the engine does not reuse "
                           "this model's cache (hybrid/Mamba models)")
        elif view.events != "synced":
            # With believed events a warm goes out on the eviction the events report, so it finds the prefix gone by
            # design: only warms on a timer say something about reuse.
            reasons.append(f"every re-warm found nothing cached ({state.num_evicted} of {state.num_evicted}): the "
                           "engine does not reuse this model's cache (hybrid/Mamba models), or evicts it at once")
    return tuple(reasons)
