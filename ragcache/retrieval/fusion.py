"""Fusing ranked lists into one (reciprocal rank, weighted scores) and diversifying a ranking (MMR).

Pure functions over document ids, scores and vectors: the knowledge base hands them the dense and keyword
rankings of a query, and these decide the order. Ties keep the order of first appearance (dense before
keyword), so a fused ranking is the same on every run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["RRF_K", "mmr", "reciprocal_rank", "weighted"]

# The constant of Cormack et al. (2009), and the default of Milvus' RRFRanker, Elasticsearch and Weaviate.
RRF_K = 60

Ranking = Sequence[tuple[str, float]]  # (document id, score), best first


def reciprocal_rank(rankings: Sequence[Ranking], *, k: int = RRF_K) -> list[tuple[str, float]]:
    """Reciprocal-rank fusion: each id scores the sum of 1 / (k + rank) over the rankings it appears in
    (rank 1 is the best). Only ranks count, so scores on different scales (cosine, BM25) fuse fairly."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, (doc_id, _) in enumerate(ranking, start=1):
            fused[doc_id] = fused.get(doc_id, 0.0) + 1.0 / (k + rank)
    return _best_first(fused)


def weighted(rankings: Sequence[Ranking], weights: Sequence[float]) -> list[tuple[str, float]]:
    """Weighted score fusion: each ranking's scores are min-max scaled to [0, 1] (BM25 is unbounded, cosine
    is not), then summed with its weight; an id missing from a ranking gets 0 there."""
    fused: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        if not ranking:
            continue
        scores = [score for _, score in ranking]
        low, span = min(scores), max(scores) - min(scores)
        for doc_id, score in ranking:
            # One hit, or all equal: nothing to scale against, so each counts fully.
            scaled = (score - low) / span if span > 0 else 1.0
            fused[doc_id] = fused.get(doc_id, 0.0) + weight * scaled
    return _best_first(fused)


def mmr(query: np.ndarray, candidates: np.ndarray, *, lambda_: float, num: int) -> list[int]:
    """Maximal marginal relevance (Carbonell & Goldstein, 1998): the positions of ``num`` candidates
    (rows of ``candidates``, best first), each chosen to maximise
    ``lambda_ * sim(query, d) - (1 - lambda_) * max sim(d, already chosen)``, cosine similarity.
    ``lambda_=1`` is the plain relevance order; lower values trade relevance for diversity."""
    if not len(candidates) or num <= 0:
        return []
    rows = _unit(np.asarray(candidates, dtype=np.float32))
    relevance = rows @ _unit(np.asarray(query, dtype=np.float32)[None, :])[0]
    redundancy = np.full(len(rows), -np.inf, dtype=np.float32)  # max similarity to a chosen row
    chosen: list[int] = []
    available = np.ones(len(rows), dtype=bool)
    for _ in range(min(num, len(rows))):
        penalty = np.where(np.isfinite(redundancy), redundancy, 0.0)
        marginal = np.where(available, lambda_ * relevance - (1 - lambda_) * penalty, -np.inf)
        best = int(np.argmax(marginal))  # the first of equals: stable
        chosen.append(best)
        available[best] = False
        redundancy = np.maximum(redundancy, rows @ rows[best])
    return chosen


def _best_first(scores: dict[str, float]) -> list[tuple[str, float]]:
    # sorted() is stable: equal scores keep first-appearance order.
    return sorted(scores.items(), key=lambda item: -item[1])


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)
