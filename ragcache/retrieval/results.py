"""The typed results of knowledge-base operations, shared by the library (``KnowledgeBase``) and the HTTP
client (``ragcache.client``), so both hand callers the same values. Plain frozen dataclasses with no heavy
imports: ``dataclasses.asdict`` of each is exactly its JSON form in the HTTP API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CollectionInfo", "IngestResult", "SearchGroup", "SearchHit", "SearchResult", "SearchTimings"]


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    space_id: str
    model: str
    dim: int
    num_documents: int


@dataclass(frozen=True)
class IngestResult:
    collection: str
    num_received: int
    num_inserted: int  # ids that were new (added)
    num_replaced: int  # ids that existed with other content and were overwritten
    num_cached: int  # embeddings served by a cache level
    num_computed: int  # embeddings the model computed
    served: dict[str, int] = field(default_factory=dict)  # level name -> embeddings it served
    num_unchanged: int = 0  # ids stored with the same content hash: nothing embedded, nothing written
    num_deleted: int = 0  # documents removed by a sync's cleanup (gone from their source)


@dataclass(frozen=True)
class SearchHit:
    id: str
    score: float  # higher is nearer: cosine similarity (dense), BM25 (keyword) or the fused score (hybrid)
    text: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class SearchGroup:
    """The hits of one source document (``group_by_source``), best first; ``ids`` name hits of the result."""

    source: str
    ids: tuple[str, ...]


@dataclass(frozen=True)
class SearchTimings:
    """Milliseconds. ``search`` is the Milvus search, or the result-cache lookup on a cached result."""

    embed: float
    search: float
    total: float
    rerank: float = 0.0  # the rerank stage (0 when the search was not reranked)


@dataclass(frozen=True)
class SearchResult:
    hits: tuple[SearchHit, ...]
    embedding_level: str | None  # the level that served the query's vector; None when the result was cached
    timings_ms: SearchTimings
    result_cache: str  # "hit", "miss", or "off" (no Redis, or Redis unusable right now)
    mode: str = "dense"  # the mode that answered: the one asked for, or "dense" after a fallback
    fallback: str | None = None  # why the asked mode fell back to dense (keyword index failing); None when it did not
    groups: tuple[SearchGroup, ...] | None = None  # with group_by_source: the hits by source document
    reranked_by: str | None = None  # the reranker that ordered the hits (their scores are its scores)
    rerank_fallback: str | None = None  # why a rerank asked for did not happen (hits in search order); None when it did
