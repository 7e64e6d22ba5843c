"""Retrieval: the knowledge base in Milvus, keyword search, fusion and ranking, ingest and sync, cached results.

Each name is imported on first use: the HTTP client reaches this package (through ``documents``, ``ranking`` and
``results``) and must not pull in pymilvus or torch, which ``knowledge`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache.observe.exports import lazy_exports

_EXPORTS = {
    ".knowledge": ("KnowledgeBase",),
    ".search": ("MAX_QUERIES",),
    ".document_store": ("in_order_asked", "DocumentQuota"),
    ".documents": ("Document", "COLLECTION_NAME_PATTERN", "FILTER_EXAMPLE", "MAX_FILTER_CHARS", "MAX_TEXT_BYTES", "check_collection_name"),
    ".names": ("CollectionName", "TenantName", "own_named", "public_name", "tenant_prefix"),
    ".ranking": ("SearchOptions", "MAX_GROUP_SIZE", "MAX_OFFSET"),
    ".fusion": ("RRF_K",),
    ".results": ("SearchResult", "SearchHit", "SearchGroup", "SearchTimings", "CollectionInfo", "IngestResult"),
    ".sync": ("SyncOptions",),
    ".ingest": ("iter_documents", "file_documents", "source_files", "find_sources", "read_documents", "SkippedFile"),
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ragcache.retrieval.document_store import DocumentQuota, in_order_asked
    from ragcache.retrieval.documents import (
        COLLECTION_NAME_PATTERN,
        FILTER_EXAMPLE,
        MAX_FILTER_CHARS,
        MAX_TEXT_BYTES,
        Document,
        check_collection_name,
    )
    from ragcache.retrieval.fusion import RRF_K
    from ragcache.retrieval.ingest import SkippedFile, file_documents, find_sources, iter_documents, read_documents, source_files
    from ragcache.retrieval.knowledge import KnowledgeBase
    from ragcache.retrieval.names import CollectionName, TenantName, own_named, public_name, tenant_prefix
    from ragcache.retrieval.ranking import MAX_GROUP_SIZE, MAX_OFFSET, SearchOptions
    from ragcache.retrieval.results import CollectionInfo, IngestResult, SearchGroup, SearchHit, SearchResult, SearchTimings
    from ragcache.retrieval.search import MAX_QUERIES
    from ragcache.retrieval.sync import SyncOptions
