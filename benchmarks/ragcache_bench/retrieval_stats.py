"""The statistics of `bench retrieval`: bootstrap intervals, paired differences, the seeded halvings the
default's verdict averages over, and fusion tuned on one half of the queries."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

K = 10
RERANK_DEPTH = 30  # hybrid candidates the reranker reorders into the top 10
RRF_KS = (1, 5, 10, 20, 40, 60, 100, 200)
DENSE_WEIGHTS = tuple(n / 10 for n in range(11))
NUM_RESAMPLES = 2000
CONFIDENCE = 0.95
METRICS = ("recall", "ndcg", "mrr")
NUM_SPLITS = 5  # seeded halvings the verdict averages over


@dataclass
class Scores:
    recall: list[float] = field(default_factory=list)
    ndcg: list[float] = field(default_factory=list)
    mrr: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)

    def add(self, ids: Sequence[str], relevant: str, seconds: float = 0.0) -> None:
        rank = ids.index(relevant) + 1 if relevant in ids[:K] else None
        self.recall.append(0.0 if rank is None else 1.0)
        # One relevant document per query: the ideal DCG is 1, so nDCG@10 = 1 / log2(rank + 1).
        self.ndcg.append(0.0 if rank is None else 1.0 / math.log2(rank + 1))
        self.mrr.append(0.0 if rank is None else 1.0 / rank)
        self.latency_s.append(seconds)

    def mean(self, name: str) -> float:
        values = getattr(self, name)
        return sum(values) / len(values) if values else float("nan")


def bootstrap_ci(values: Sequence[float], *, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean of ``values`` (queries resampled with replacement)."""
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(NUM_RESAMPLES, len(data)))].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def paired_difference(a: Sequence[float], b: Sequence[float], *, seed: int = 0) -> tuple[float, float, float]:
    """mean(a - b) over the same queries, with its paired bootstrap interval: (mean, low, high)."""
    differences = [x - y for x, y in zip(a, b, strict=True)]
    low, high = bootstrap_ci(differences, seed=seed)
    return sum(differences) / len(differences), low, high


def split_halves(queries: Sequence, *, seed: int) -> tuple[list, list]:
    """(tuning half, report half) of the queries, by a seeded shuffle (the same halving for any sequence of
    that length, e.g. the queries' numbers)."""
    shuffled = list(queries)
    random.Random(seed).shuffle(shuffled)
    middle = len(shuffled) // 2
    return shuffled[:middle], shuffled[middle:]


@dataclass(frozen=True)
class Split:
    """One halving of the queries: the fusion tuned on its tuning half, and each mode's nDCG@10 on its report half.

    ``report`` holds the report half's query numbers (over both FAQs, in the order ``ndcg``'s lists follow);
    ``ndcg`` maps "dense", "keyword" and "hybrid" (the tuned fusion, ``hybrid_name``) to their per-query scores."""

    seed: int
    tuning: dict
    hybrid_name: str
    report: tuple[int, ...]
    ndcg: dict[str, list[float]]


def splits_difference(splits: Sequence[Split], mode: str, num_queries: int, *, seed: int = 0) -> tuple[float, float, float]:
    """The paired nDCG@10 difference ``mode`` - dense on each split's report half, averaged over the splits, with
    its 95% percentile-bootstrap interval: (mean, low, high). Each resample draws the ``num_queries`` queries
    with replacement once for every split (the splits share their queries, so their errors are not independent),
    and recomputes each split's mean over its report half with those counts; the tuning is held fixed."""
    counts = np.random.default_rng(seed).multinomial(num_queries, [1 / num_queries] * num_queries, size=NUM_RESAMPLES)
    point, resampled = [], []
    for split in splits:
        differences = np.asarray(split.ndcg[mode]) - np.asarray(split.ndcg["dense"])
        weights = counts[:, list(split.report)]
        point.append(float(differences.mean()))
        resampled.append(weights @ differences / np.maximum(weights.sum(axis=1), 1))
    means = np.mean(resampled, axis=0)
    tail = (1 - CONFIDENCE) / 2 * 100
    return float(np.mean(point)), float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def winning_mode(splits: Sequence[Split], num_queries: int, *, seed: int = 0) -> str:
    """The mode the data says should be the default: dense (one ranked list, no BM25 index to keep) unless
    keyword or hybrid beats it with the whole 95% interval of ``splits_difference`` above zero; of two that
    do, the one with the higher mean."""
    beating = {mode: splits_difference(splits, mode, num_queries, seed=seed) for mode in ("keyword", "hybrid")}
    better = [(mean, mode) for mode, (mean, low, _) in beating.items() if low > 0]
    return max(better)[1] if better else "dense"


def tuned_hybrid(tuning: dict) -> tuple[str, object]:
    """(name, SearchOptions) of the fusion that did best on the tuning queries: tuned RRF or tuned weighted."""
    from ragcache.retrieval.ranking import SearchOptions

    rrf_k, dense_weight = tuning["rrf"]["rrf_k"], tuning["weighted"]["dense_weight"]
    if tuning["rrf"]["ndcg_by_rrf_k"][rrf_k] >= tuning["weighted"]["ndcg_by_dense_weight"][dense_weight]:
        return f"hybrid rrf (k={rrf_k}, tuned)", SearchOptions(mode="hybrid", rrf_k=rrf_k)
    return f"hybrid weighted (dense {dense_weight:g}, tuned)", SearchOptions(mode="hybrid", fusion="weighted", dense_weight=dense_weight)


def evaluate_split(candidates_by_set: Sequence[Sequence[tuple[Sequence, Sequence, str]]], *, seed: int) -> Split:
    """Halve each set's queries by ``seed`` (as ``split_halves``), tune fusion on the tuning halves and score
    dense, keyword and the tuned hybrid on the report halves. ``candidates_by_set``: per set, each query's
    dense and keyword hits (as ``tune_fusion`` takes them), in the set's query order; queries are numbered
    over the sets in that order."""
    from ragcache.retrieval.ranking import SearchOptions

    tuning_half, report = [], []
    offset = 0
    for candidates in candidates_by_set:
        tune, rest = split_halves(range(offset, offset + len(candidates)), seed=seed)
        tuning_half += [candidates[number - offset] for number in tune]
        report += [(number, candidates[number - offset]) for number in rest]
        offset += len(candidates)
    tuning = tune_fusion(tuning_half)
    hybrid_name, hybrid = tuned_hybrid(tuning)
    modes = {"dense": SearchOptions(mode="dense"), "keyword": SearchOptions(mode="keyword"), "hybrid": hybrid}
    ndcg = {}
    for mode, options in modes.items():
        scores = Scores()
        for _, (dense, keyword, relevant) in report:
            scores.add(fused_ids(options, dense, keyword), relevant)
        ndcg[mode] = scores.ndcg
    return Split(seed, tuning, hybrid_name, tuple(number for number, _ in report), ndcg)


def fused_ids(options, dense: Sequence, keyword: Sequence) -> list[str]:
    """The top 10 a search in ``options`` returns, from the query's dense and keyword hits: the library's own
    ``fuse``, exactly as a search fuses them."""
    from ragcache.retrieval.ranking import fuse

    return [hit.id for hit in fuse(options, dense, keyword)[:K]]


def tune_fusion(candidates: Sequence[tuple[Sequence, Sequence, str]]) -> dict[str, dict]:
    """The best ``rrf_k`` and ``dense_weight`` by mean nDCG@10 over ``candidates`` (each query's dense hits,
    keyword hits, each as deep as hybrid search asks for, and its relevant id), fused by the library's own
    ``fuse`` exactly as a hybrid search fuses them. Ties go to the first setting tried."""
    from ragcache.retrieval.ranking import SearchOptions

    def mean_ndcg(options: SearchOptions) -> float:
        scores = Scores()
        for dense, keyword, relevant in candidates:
            scores.add(fused_ids(options, dense, keyword), relevant)
        return scores.mean("ndcg")

    rrf = {k: mean_ndcg(SearchOptions(mode="hybrid", fusion="rrf", rrf_k=k)) for k in RRF_KS}
    weighted = {w: mean_ndcg(SearchOptions(mode="hybrid", fusion="weighted", dense_weight=w)) for w in DENSE_WEIGHTS}
    best_k = max(rrf, key=lambda k: (rrf[k], -RRF_KS.index(k)))
    best_w = max(weighted, key=lambda w: (weighted[w], -DENSE_WEIGHTS.index(w)))
    return {"rrf": {"rrf_k": best_k, "ndcg_by_rrf_k": rrf}, "weighted": {"dense_weight": best_w, "ndcg_by_dense_weight": weighted}}
