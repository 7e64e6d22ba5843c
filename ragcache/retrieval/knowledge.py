"""Knowledge bases: named document collections in Milvus, each bound to one embedding space.

Documents (id, text, metadata) are embedded through an ``EmbeddingCache`` and upserted by id; a search
embeds the query through the same cache and asks Milvus for the nearest documents, optionally filtered
on their metadata. Result lists may be cached in Redis (``ResultCache``); every ingest or delete
invalidates them.

A collection records, in its Milvus description, the space its vectors belong to: vectors of two spaces
are not comparable, so using a collection with a cache of another space is a ``ConflictError`` rather
than a silently meaningless ranking.

``KnowledgeBase`` is the facade: collections live in ``catalog``, documents in ``document_store``, searches in
``search``, and every Milvus call goes through ``gateway`` (its breaker and error conversion).

A collection is named by a string, or by a ``CollectionName`` (``ragcache.retrieval.names``: a tenant's name and
the name it is stored under); errors name it as the caller does.

    >>> kb = KnowledgeBase(stores.milvus, redis=stores.redis)
    >>> kb.add_documents("docs", [{"id": "1", "text": "KV caches hold attention keys"}], cache=cache)
    >>> kb.search("docs", "what is a KV cache?", cache=cache, top_k=3).hits[0].id
    '1'
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from pymilvus import MilvusClient

from ragcache.core.cache import EmbeddingCache
from ragcache.retrieval.catalog import DEFAULT_INDEX_TYPE, DESCRIPTION_FORMAT, METRIC, RECORD_TTL_S, Catalog
from ragcache.retrieval.document_store import DocumentQuota, DocumentStore
from ragcache.retrieval.documents import Document
from ragcache.retrieval.gateway import MilvusGateway
from ragcache.retrieval.names import CollectionName
from ragcache.retrieval.ranking import SearchOptions
from ragcache.retrieval.result_cache import DEFAULT_MAX_VALUE_BYTES, ResultCache
from ragcache.retrieval.results import CollectionInfo, IngestResult, SearchHit, SearchResult, SearchTimings
from ragcache.retrieval.search import Searcher
from ragcache.retrieval.sync import SyncOptions

# What callers import from here, wherever it is defined: the facade is the knowledge base's public surface.
__all__ = [
    "KnowledgeBase", "CollectionInfo", "CollectionName", "IngestResult", "SearchHit", "SearchOptions", "SearchResult", "SearchTimings",
    "DESCRIPTION_FORMAT", "METRIC",
]


class KnowledgeBase:
    """Document collections in one Milvus database (``Stores.milvus``), with an optional Redis result cache.

    A facade over three parts that share one Milvus gateway: the ``catalog`` (collections and their schema),
    the ``documents`` (ingest, sync, reads, deletes) and the ``searcher`` (planning, ranking, the result cache).
    Thread-safe: the service calls it from many worker threads.
    """

    def __init__(
        self,
        milvus: MilvusClient,
        *,
        redis=None,
        result_ttl_s: int = 300,
        result_max_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        index_type: str = DEFAULT_INDEX_TYPE,
        max_top_k: int = 1000,
        record_ttl_s: float = RECORD_TTL_S,
        keyword_index: bool = True,
        quota: DocumentQuota | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        """``keyword_index``: collections created from now on get the BM25 field (``ragcache.retrieval.keyword``), which
        keyword and hybrid search need; it slows Milvus' writes (Milvus Lite: 3,177 -> 846 rows/s). ``quota``: the most
        documents a collection and a tenant may hold (``DocumentQuota``; an ingest past it is refused whole)."""
        self.milvus = milvus
        self.results = ResultCache(redis, ttl_s=result_ttl_s, max_value_bytes=result_max_bytes) if redis is not None else None
        gateway = MilvusGateway(milvus)
        self.health = gateway.health  # the breaker of Milvus as the knowledge base's store
        self.catalog = Catalog(gateway, index_type=index_type, record_ttl_s=record_ttl_s, keyword_index=keyword_index,
                               clock=clock)
        self.documents = DocumentStore(self.catalog, self.results, quota)
        self.searcher = Searcher(self.catalog, self.results, max_top_k=max_top_k, clock=clock)
        self.keyword_health = self.searcher.keyword_health  # the keyword searches' own breaker

    # ---- collections -----------------------------------------------------------------------------------

    def create_collection(self, collection: str | CollectionName, *, cache: EmbeddingCache) -> CollectionInfo:
        """Create an empty collection for the cache's space (nothing happens when it exists in that space)."""
        return self.catalog.create_collection(CollectionName.of(collection), cache.space)

    def drop_collection(self, collection: str | CollectionName) -> None:
        """Delete a collection and all its documents (and its cached search results)."""
        dropped = self.catalog.drop_collection(CollectionName.of(collection))
        if self.results is not None:
            self.results.discard(dropped.uid)

    def collection_names(self, *, prefix: str = "") -> list[str]:
        """The names of the collections starting with ``prefix``: one call, nothing read or loaded."""
        return self.catalog.collection_names(prefix=prefix)

    def list_collections(self, *, prefix: str = "") -> list[CollectionInfo]:
        """The collections whose names start with ``prefix`` (a tenant's), by name; see ``Catalog.list_collections``."""
        return self.catalog.list_collections(prefix=prefix)

    def collection_info(self, collection: str | CollectionName) -> CollectionInfo:
        return self.catalog.collection_info(CollectionName.of(collection))

    # ---- documents -------------------------------------------------------------------------------------

    def add_documents(
        self,
        collection: str | CollectionName,
        documents: Sequence[Document | dict],
        *,
        cache: EmbeddingCache,
        sync: SyncOptions | None = None,
    ) -> IngestResult:
        """Embed the documents through ``cache`` and upsert them by id, creating the collection if needed.

        A document stored with the same content hash is left alone (nothing embedded or written); ``sync``
        then deletes what is gone from the source (``ragcache.retrieval.sync``)."""
        return self.documents.add_documents(collection, documents, cache, sync)

    def list_ids(self, collection: str | CollectionName, filter: str | None = None) -> list[str]:  # noqa: A002 - the API's name
        """The ids of the collection's documents (matching ``filter``), at most ``MAX_LISTED_IDS``."""
        return self.documents.list_ids(collection, filter)

    def get_documents(self, collection: str | CollectionName, ids: Sequence[str]) -> list[Document]:
        """The documents with these ids, in the order asked (repeats folded); unknown ids are left out."""
        return self.documents.get_documents(collection, ids)

    def document_batches(self, collection: str | CollectionName, ids: Sequence[str]) -> Iterator[list[Document]]:
        """``get_documents`` one Milvus call at a time, so that a caller with a byte budget can stop early."""
        return self.documents.document_batches(collection, ids)

    def delete_documents(self, collection: str | CollectionName, ids: Sequence[str]) -> int:
        """Delete documents by id; returns how many existed (unknown ids are ignored)."""
        return self.documents.delete_documents(collection, ids)

    # ---- search ----------------------------------------------------------------------------------------

    def search(
        self,
        collection: str | CollectionName,
        query: str,
        *,
        cache: EmbeddingCache,
        top_k: int = 10,
        filter: str | None = None,  # noqa: A002 - the public name of the parameter, as in the HTTP API
        options: SearchOptions | None = None,
        query_cache: EmbeddingCache | None = None,
        with_text: bool = True,
    ) -> SearchResult:
        """The ``top_k`` documents nearest to ``query``, optionally filtered by a Milvus boolean expression
        (e.g. ``metadata["lang"] == "en"``) and ranked as ``options`` say (dense by default).

        ``cache`` is the space the collection's documents were embedded in; ``query_cache``, when given,
        embeds the query instead: the same model under its query prompt (``ragcache.models.prompts``).
        ``with_text``: as in ``search_many``."""
        return self.searcher.search_many(collection, [query], cache, query_cache, top_k, filter, options, with_text)[0]

    def search_many(
        self,
        collection: str | CollectionName,
        queries: Sequence[str],
        *,
        cache: EmbeddingCache,
        top_k: int = 10,
        filter: str | None = None,  # noqa: A002 - the public name of the parameter, as in the HTTP API
        options: SearchOptions | None = None,
        query_cache: EmbeddingCache | None = None,
        with_text: bool = True,
    ) -> list[SearchResult]:
        """``search`` for several queries at once: one embedding batch and one Milvus search per ranked list
        for all of them; each query's result is cached on its own.

        ``with_text=False`` leaves the documents' texts in Milvus (each hit's ``text`` is ""): most of a
        result's bytes, when a caller wants ids, scores and metadata only. A result cached with its texts
        still answers; one searched without them is not cached."""
        return self.searcher.search_many(collection, queries, cache, query_cache, top_k, filter, options, with_text)

    async def search_cached(
        self,
        collection: str | CollectionName,
        query: str,
        *,
        cache: EmbeddingCache,
        top_k: int = 10,
        filter: str | None = None,  # noqa: A002 - the public name of the parameter, as in the HTTP API
        options: SearchOptions | None = None,
        query_cache: EmbeddingCache | None = None,
    ) -> SearchResult | None:
        """The cached result of ``search`` with these arguments, found without blocking (for an event loop);
        None when there is none (or it cannot be had without blocking): then call ``search``."""
        return await self.searcher.search_cached(collection, query, cache, query_cache, top_k, filter, options)
