"""Reranking: score (query, text) pairs with a cross-encoder, locally or through a remote rerank API, with
the scores cached like vectors.

    base      the ``Reranker`` interface and the result types
    local     ``CrossEncoderReranker`` (sentence-transformers ``CrossEncoder``)
    remote    ``RemoteReranker`` (TEI or Cohere/Infinity ``/rerank`` through ``ragcache.outbound``)
    scores    ``RerankCache``: the scores in L1/L2, keyed by the reranker's space and the pair
    build     the served rerankers from settings
    tiny      a tiny random cross-encoder built offline, for the mechanics only
"""

# Only the light types here: the HTTP client imports them, and must not pull in torch (scores, local do).
from ragcache.rerank.base import Reranker, RerankHit, RerankResult, score_space

__all__ = ["Reranker", "RerankHit", "RerankResult", "score_space"]
