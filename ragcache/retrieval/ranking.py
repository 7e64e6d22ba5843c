"""How a search ranks: its options (mode, fusion, paging, threshold, MMR, grouping), checked once, and the
steps that turn the candidates Milvus returned into the page of hits a caller gets.

The order of steps is fixed: fuse (hybrid) -> drop scores under ``score_threshold`` -> MMR (when asked)
-> group by source (when asked) -> skip ``offset`` -> keep ``top_k``. Paging therefore pages the final
order: page 2 (``offset=top_k``) starts where page 1 ended, as long as the collection did not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ragcache.errors import InvalidInputError
from ragcache.retrieval.fusion import RRF_K, mmr, reciprocal_rank, weighted
from ragcache.retrieval.results import SearchGroup, SearchHit

__all__ = ["FUSIONS", "MODES", "SearchOptions", "finish", "fuse", "group_hits", "source_of"]

MODES = ("dense", "keyword", "hybrid")
FUSIONS = ("rrf", "weighted")
MAX_OFFSET = 1000
MAX_GROUP_SIZE = 100
# Most candidates one ranked list may ask Milvus for: offset + top_k (at most 2000) fits, and the wider pools
# of hybrid, MMR and grouping stop here (Milvus itself allows 16384).
MAX_CANDIDATES = 2048
# How much deeper than the page each list is searched: fusion needs overlap between the lists, MMR a pool
# to choose from (LangChain's fetch_k is 20 for k=4), grouping several chunks per source.
HYBRID_DEPTH, MMR_DEPTH, GROUP_DEPTH = 2, 4, 4


@dataclass(frozen=True)
class SearchOptions:
    """How to rank. ``score_threshold`` compares against the score of the mode: cosine similarity (dense),
    BM25 (keyword), or the fused score (hybrid: rrf at most 2 / (rrf_k + 1), weighted in [0, 1])."""

    mode: str = "dense"
    fusion: str = "rrf"
    rrf_k: int = RRF_K
    dense_weight: float = 0.5  # weighted fusion: the keyword ranking weighs 1 - dense_weight
    offset: int = 0
    score_threshold: float | None = None
    mmr_lambda: float | None = None  # None: no MMR; 1.0 relevance only, 0.0 diversity only
    group_by_source: bool = False
    group_size: int = 1  # hits kept per source when grouping

    def __post_init__(self) -> None:
        _check_choice(self.mode, MODES, "mode")
        _check_choice(self.fusion, FUSIONS, "fusion")
        _check_int(self.rrf_k, "rrf_k", 1, 10_000)
        _check_int(self.offset, "offset", 0, MAX_OFFSET)
        _check_int(self.group_size, "group_size", 1, MAX_GROUP_SIZE)
        _check_float(self.dense_weight, "dense_weight", 0.0, 1.0)
        if self.mmr_lambda is not None:
            _check_float(self.mmr_lambda, "mmr_lambda", 0.0, 1.0)
        if self.score_threshold is not None:
            _check_float(self.score_threshold, "score_threshold", -math.inf, math.inf)
        if not isinstance(self.group_by_source, bool):
            raise InvalidInputError("group_by_source must be true or false", field="group_by_source")

    @property
    def uses_keyword(self) -> bool:
        return self.mode in ("keyword", "hybrid")

    @property
    def uses_dense(self) -> bool:
        return self.mode in ("dense", "hybrid")

    def num_candidates(self, top_k: int) -> int:
        """How many hits to ask of each ranked list for a page of ``top_k`` after ``offset``."""
        depth = self.offset + top_k
        factor = max(
            HYBRID_DEPTH if self.mode == "hybrid" else 1,
            MMR_DEPTH if self.mmr_lambda is not None else 1,
            GROUP_DEPTH * self.group_size if self.group_by_source else 1,
        )
        return min(MAX_CANDIDATES, depth * factor)

    def key(self) -> dict:
        """Everything that changes the answer, for the result-cache key."""
        return asdict(self)


def fuse(options: SearchOptions, dense: Sequence[SearchHit], keyword: Sequence[SearchHit]) -> list[SearchHit]:
    """One ranking from the dense and keyword hits of a query (whichever the mode uses), with fused scores."""
    if options.mode == "dense":
        return list(dense)
    if options.mode == "keyword":
        return list(keyword)
    by_id = {hit.id: hit for hit in (*dense, *keyword)}
    rankings = [[(hit.id, hit.score) for hit in dense], [(hit.id, hit.score) for hit in keyword]]
    if options.fusion == "rrf":
        fused = reciprocal_rank(rankings, k=options.rrf_k)
    else:
        fused = weighted(rankings, [options.dense_weight, 1.0 - options.dense_weight])
    return [SearchHit(doc_id, score, by_id[doc_id].text, by_id[doc_id].metadata) for doc_id, score in fused]


def finish(
    options: SearchOptions,
    ranked: Sequence[SearchHit],
    top_k: int,
    *,
    query_vector: np.ndarray | None = None,
    vectors: dict[str, np.ndarray] | None = None,
) -> tuple[SearchHit, ...]:
    """The page of hits from a ranking: threshold, MMR (needs the query's and the hits' vectors), grouping,
    offset and top_k, in that order."""
    hits = list(ranked)
    if options.score_threshold is not None:
        hits = [hit for hit in hits if hit.score >= options.score_threshold]
    if options.mmr_lambda is not None and hits and query_vector is not None and vectors:
        hits = [hit for hit in hits if hit.id in vectors]
        matrix = np.stack([vectors[hit.id] for hit in hits])
        hits = [hits[i] for i in mmr(query_vector, matrix, lambda_=options.mmr_lambda, num=len(hits))]
    if options.group_by_source:
        page = group_hits(hits, options.group_size)[options.offset : options.offset + top_k]
        by_id = {hit.id: hit for hit in hits}
        return tuple(by_id[doc_id] for group in page for doc_id in group.ids)
    return tuple(hits[options.offset : options.offset + top_k])


def source_of(hit: SearchHit) -> str:
    """The source a hit's document came from: its ``metadata["source"]`` (``ragcache ingest`` sets it to the
    file, so a file's chunks share it), else the document itself (its id)."""
    source = hit.metadata.get("source")
    return source if isinstance(source, str) and source else hit.id


def group_hits(hits: Sequence[SearchHit], group_size: int = MAX_GROUP_SIZE) -> tuple[SearchGroup, ...]:
    """Hits grouped by source, groups in order of their best hit, at most ``group_size`` hits each. Grouping
    a page that ``finish`` grouped gives the same groups back (the response is built that way)."""
    groups: dict[str, list[str]] = {}
    for hit in hits:
        members = groups.setdefault(source_of(hit), [])
        if len(members) < group_size:
            members.append(hit.id)
    return tuple(SearchGroup(source, tuple(ids)) for source, ids in groups.items())


def _check_choice(value: object, choices: tuple[str, ...], field: str) -> None:
    if value not in choices:
        raise InvalidInputError(f"{field} must be one of {', '.join(choices)}; got {value!r}", field=field)


def _check_int(value: object, field: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInputError(f"{field} must be an integer from {low} to {high}, got {value!r}", field=field)


def _check_float(value: object, field: str, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        bounds = "a finite number" if math.isinf(low) else f"a number from {low} to {high}"
        raise InvalidInputError(f"{field} must be {bounds}, got {value!r}", field=field)
