"""The rerank stage of a search: reorder its hits by a reranker's scores, or say why it could not.

A reranker that fails (a remote API down or timed out, a local model failing) never fails the search: the
hits come back in search order, cut to ``top_n``, with ``rerank_fallback`` saying what happened, so a caller
can tell a reranked answer from one that is not (the service also sends ``X-Rerank-Fallback``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from ragcache.core.scope import UNSCOPED, Scope
from ragcache.errors import ComputeError, TierUnavailableError
from ragcache.rerank.scores import RerankCache
from ragcache.retrieval.results import SearchResult

__all__ = ["rerank_result"]

log = logging.getLogger(__name__)


def rerank_result(
    result: SearchResult,
    query: str,
    reranker: RerankCache,
    *,
    top_n: int | None = None,
    scope: Scope = UNSCOPED,
    clock: Callable[[], float] = time.perf_counter,
) -> SearchResult:
    """The hits reordered by ``reranker`` (each ``score`` becomes the reranker's), at most ``top_n``."""
    started = clock()
    try:
        ranked = reranker.rerank(query, [hit.text for hit in result.hits], top_n=top_n, scope=scope)
    except (TierUnavailableError, ComputeError) as exc:
        reason = f"reranker {reranker.name!r} failed, so the hits are in search order: {exc}"
        log.warning("%s", reason)
        return dataclasses.replace(result, hits=result.hits[:top_n], rerank_fallback=reason)
    hits = tuple(dataclasses.replace(result.hits[hit.index], score=hit.score) for hit in ranked.hits)
    rerank_ms = round((clock() - started) * 1000, 3)
    timings = dataclasses.replace(result.timings_ms, rerank=rerank_ms, total=round(result.timings_ms.total + rerank_ms, 3))
    return dataclasses.replace(result, hits=hits, timings_ms=timings, reranked_by=reranker.name)
