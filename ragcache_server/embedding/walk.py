"""The one continuation of an embedding request from its plan to its vectors.

L1 is asked once, on the event loop (``EmbeddingCache.probe``): when it holds every text, that is the answer, with no
thread hop. Otherwise the probe carries on: its L1 answer is the walk's first step, in a group of concurrent requests
(``groups.py``) or alone (a pass-through caller's, whose misses are paid with its own key), so a missed text asks L1
twice in all: the probe, and the model batcher's last look before computing it. Only when truncating: a cached vector
says nothing about whether its text would pass the length check, so a request that does not truncate checks the lengths
in the walk's thread first and walks alone (L1 asked by the walk and the batcher: twice too).
"""

from __future__ import annotations

from contextlib import nullcontext

from ragcache import InvalidInputError, InvalidTextError
from ragcache.core import EmbedResult, Probe
from ragcache_server.deps import blocking
from ragcache_server.embedding.groups import EmbedGroups
from ragcache_server.embedding.plan import EmbedPlan
from ragcache_server.errors import HTTPError

__all__ = ["vectors_of"]


async def vectors_of(plan: EmbedPlan, groups: EmbedGroups | None) -> tuple[EmbedResult, int | None]:
    """The plan's vectors, and their total token count when the plan counts in the walk's thread (None: L1 answered
    on the event loop, or nothing to count)."""
    cache, count = plan.cache, plan.count_in_walk
    probe: Probe | None = None
    if plan.truncate:
        outcome = cache.probe(plan.texts, normalize=plan.call.normalize)
        if isinstance(outcome, EmbedResult):
            return outcome, None
        probe = outcome
        if plan.caller_scope is None and groups is not None:
            return await groups.embed(cache, plan.texts, probe=probe, normalize=plan.call.normalize, count_tokens=count)

    def work() -> tuple[EmbedResult, int | None]:
        if not plan.truncate:
            try:
                cache.tokenizer.check_lengths(plan.texts, plan.call.field)
            except InvalidTextError:
                raise  # not valid Unicode: a 422 naming the item, not a length
            except InvalidInputError as exc:
                raise HTTPError(413, str(exc), field=exc.field) from exc
        scope = plan.caller_scope
        with scope(plan.texts) if scope is not None else nullcontext():  # pass-through: the caller's key for its misses
            result = cache.embed_detailed(plan.texts, normalize=plan.call.normalize, probe=probe)
        return result, count(plan.texts) if count is not None else None

    # The cache blocks (Redis, Milvus, the model): it runs in a worker thread, off the event loop. At the
    # request deadline the thread is abandoned, not awaited; what it computes still lands in the cache.
    return await blocking(work)
