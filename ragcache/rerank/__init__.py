"""Reranking: score (query, text) pairs with a cross-encoder, locally or through a remote rerank API, with
the scores cached like vectors.

    base      the ``Reranker`` interface and the result types
    local     ``CrossEncoderReranker`` (sentence-transformers ``CrossEncoder``)
    remote    ``RemoteReranker`` (TEI or Cohere/Infinity ``/rerank`` through ``ragcache.outbound``)
    scores    ``RerankCache``: the scores in L1/L2, keyed by the reranker's space and the pair
    stage     ``rerank_result``: a search result reordered by a reranker
    build     the served rerankers from settings (their score caches: ``ragcache.build.score_cache``)
    tiny      a tiny random cross-encoder built offline, for the mechanics only

Each name is imported on first use: the HTTP client imports the result types and must not pull in torch, which
``scores``, ``stage`` and ``build`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache.observe.exports import lazy_exports

_EXPORTS = {
    ".base": ("Reranker", "RerankHit", "RerankResult", "score_space"),
    ".scores": ("RerankCache",),
    ".stage": ("rerank_result",),
    ".build": ("build_rerankers",),
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ragcache.rerank.base import Reranker, RerankHit, RerankResult, score_space
    from ragcache.rerank.build import build_rerankers
    from ragcache.rerank.scores import RerankCache
    from ragcache.rerank.stage import rerank_result
