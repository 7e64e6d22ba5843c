"""``bench retrieval``: recall@10, nDCG@10 and MRR@10 of dense, keyword, hybrid and hybrid+rerank search, with
latency per query, on a labelled set derived mechanically from WordNet (``ragcache_bench.wordnet``).

Same collection (Milvus Lite, the real model), same queries, one run. Every query's vector is computed before
any timing, so each mode's latency is its search (and rerank) alone; the modes take turns query by query, so
the drift of a shared machine hits them alike.

Verdicts: hybrid beats dense on nDCG@10; hybrid+rerank beats hybrid, judged only with a reranker that has
trained weights (``RAGCACHE_RERANK_MODELS``: a cross-encoder folder). None can be installed offline here
(docs/reranking.md): then the stage runs with a tiny random cross-encoder, for its mechanics and latency only,
and the verdict says that reranking quality cannot be measured, and why.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from statistics import median

from ragcache_bench.context import BenchContext
from ragcache_bench.report import BenchResult, Target
from ragcache_bench.wordnet import build_retrieval_set

K = 10
RERANK_DEPTH = 30  # hybrid candidates the reranker reorders into the top 10
COLLECTION = "bench_wordnet"
MODES = ("dense", "keyword", "hybrid", "hybrid+rerank")
# "Beats": better by at least a tenth of a point of nDCG@10, not by rounding.
MARGIN = 0.001


@dataclass
class Scores:
    recall: list[float] = field(default_factory=list)
    ndcg: list[float] = field(default_factory=list)
    mrr: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)

    def add(self, ids: list[str], relevant: str, seconds: float) -> None:
        rank = ids.index(relevant) + 1 if relevant in ids[:K] else None
        self.recall.append(0.0 if rank is None else 1.0)
        # One relevant document per query: the ideal DCG is 1, so nDCG@10 = 1 / log2(rank + 1).
        self.ndcg.append(0.0 if rank is None else 1.0 / math.log2(rank + 1))
        self.mrr.append(0.0 if rank is None else 1.0 / rank)
        self.latency_s.append(seconds)

    def mean(self, name: str) -> float:
        values = getattr(self, name)
        return sum(values) / len(values) if values else float("nan")


def _reranker(ctx: BenchContext):
    """(the score cache of the configured cross-encoder, True) or (the tiny random one's, False)."""
    from ragcache.rerank.build import score_cache
    from ragcache.rerank.local import CrossEncoderReranker
    from ragcache.rerank.tiny import build_tiny_cross_encoder
    from ragcache.settings import Settings
    from ragcache.storage.stores import Stores

    configured = Settings.load().rerank_models
    path = configured[0] if configured else str(build_tiny_cross_encoder(ctx.workdir / "tiny-cross-encoder"))
    reranker = CrossEncoderReranker(path, device="cpu")
    return score_cache(ctx.settings, Stores(None, None), reranker), bool(configured)


def bench_retrieval(ctx: BenchContext) -> BenchResult:
    from ragcache.rerank.stage import rerank_result
    from ragcache.retrieval.knowledge import KnowledgeBase
    from ragcache.retrieval.ranking import SearchOptions

    num_documents, num_queries = (2_000, 200) if ctx.quick else (10_000, 1_000)
    labelled = build_retrieval_set(num_documents, num_queries, seed=ctx.seed)
    result = BenchResult("retrieval", f"search quality on labelled WordNet data: {labelled.description}")
    cache = ctx.fresh_cache(l2=False, l3=False, l1_bytes=256 * 1024 * 1024)
    kb = KnowledgeBase(ctx.milvus)
    if COLLECTION in {info.name for info in kb.list_collections()}:
        kb.drop_collection(COLLECTION)
    started = time.perf_counter()
    for start in range(0, len(labelled.documents), 256):
        kb.add_documents(COLLECTION, labelled.documents[start : start + 256], cache=cache)
    ingest_s = time.perf_counter() - started
    cache.embed([query for query, _ in labelled.queries])  # every query vector in L1 before timing
    reranker, real_weights = _reranker(ctx)

    options = {mode: SearchOptions(mode=mode) for mode in ("dense", "keyword", "hybrid")}
    scores = {mode: Scores() for mode in MODES}
    for number, (query, relevant) in enumerate(labelled.queries):
        turn = number % len(MODES)
        for mode in MODES[turn:] + MODES[:turn]:
            t0 = time.perf_counter()
            if mode == "hybrid+rerank":
                found = kb.search(COLLECTION, query, cache=cache, top_k=RERANK_DEPTH, options=options["hybrid"])
                found = rerank_result(found, query, reranker, top_n=K)
                if found.rerank_fallback is not None:
                    raise RuntimeError(found.rerank_fallback)
            else:
                found = kb.search(COLLECTION, query, cache=cache, top_k=K, options=options[mode])
            scores[mode].add([hit.id for hit in found.hits], relevant, time.perf_counter() - t0)

    _report(result, scores, real_weights, reranker.name)
    _repeated_rerank(result, kb, cache, reranker, labelled.queries[:100], options["hybrid"])
    result.details = {
        "dataset": labelled.description, "documents": len(labelled.documents), "queries": len(labelled.queries),
        "ingest_s": ingest_s, "rerank_depth": RERANK_DEPTH, "reranker": reranker.name, "reranker_trained": real_weights,
        "per_mode": {mode: {name: s.mean(name) for name in ("recall", "ndcg", "mrr")} | {"latency_p50_ms": median(s.latency_s) * 1000}
                     for mode, s in scores.items()},
    }
    reranker.close()
    cache.close()
    return result


def _report(result: BenchResult, scores: dict[str, Scores], real_weights: bool, reranker: str) -> None:
    for mode, s in scores.items():
        label = mode if mode != "hybrid+rerank" or real_weights else "hybrid+rerank (random tiny model)"
        note = "" if mode != "hybrid+rerank" or real_weights else "mechanics and latency only: its scores mean nothing"
        result.add(f"{label}: recall@10", s.mean("recall"), note=note)
        result.add(f"{label}: nDCG@10", s.mean("ndcg"))
        result.add(f"{label}: MRR@10", s.mean("mrr"))
        result.add(f"{label}: latency p50", median(s.latency_s) * 1000, "ms", note=f"p99 {_p99(s.latency_s) * 1000:.1f} ms")
    gain = scores["hybrid"].mean("ndcg") - scores["dense"].mean("ndcg")
    result.add("hybrid - dense, nDCG@10", gain, target=Target(">=", MARGIN), goal="hybrid beats dense")
    if real_weights:
        rerank_gain = scores["hybrid+rerank"].mean("ndcg") - scores["hybrid"].mean("ndcg")
        result.add("hybrid+rerank - hybrid, nDCG@10", rerank_gain, target=Target(">=", MARGIN), goal="rerank beats hybrid",
                   note=f"reranker {reranker}")
    else:
        result.add("hybrid+rerank - hybrid, nDCG@10", "cannot be measured", goal="rerank beats hybrid",
                   note="no trained cross-encoder weights install offline here (docs/reranking.md); "
                   "RAGCACHE_RERANK_MODELS=<cross-encoder folder> judges it")


def _repeated_rerank(result: BenchResult, kb, cache, reranker, queries: list[tuple[str, str]], hybrid) -> None:
    """The same queries reranked again: every score must come from the score cache (L1), none computed."""
    from ragcache.rerank.stage import rerank_result

    cold, warm, num_computed = [], [], 0
    for query, _ in queries:
        found = kb.search(COLLECTION, query, cache=cache, top_k=RERANK_DEPTH, options=hybrid)
        texts = [hit.text for hit in found.hits]
        t0 = time.perf_counter()
        reranker.rerank(query + " (cold)", texts)  # a query never seen: every score computed
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        again = rerank_result(found, query, reranker, top_n=K)
        warm.append(time.perf_counter() - t0)
        num_computed += reranker.rerank(query, texts).served.get("compute", 0)
        if again.rerank_fallback is not None:
            raise RuntimeError(again.rerank_fallback)
    ratio = median(cold) / median(warm)
    result.add("rerank of 30 candidates: computed / cached", ratio if num_computed == 0 else f"{num_computed} scores computed", "x",
               target=Target(">=", 2.0), goal="repeated query reranks for free",
               note=f"{median(cold) * 1000:.1f} ms computed vs {median(warm) * 1000:.2f} ms from L1, {len(queries)} queries")


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
