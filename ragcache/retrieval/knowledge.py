"""Knowledge bases: named document collections in Milvus, each bound to one embedding space.

Documents (id, text, metadata) are embedded through an ``EmbeddingCache`` and upserted by id; a search
embeds the query through the same cache and asks Milvus for the nearest documents, optionally filtered
on their metadata. Result lists may be cached in Redis (``ResultCache``); every ingest or delete
invalidates them.

A collection records, in its Milvus description, the space its vectors belong to: vectors of two spaces
are not comparable, so using a collection with a cache of another space is a ``ConflictError`` rather
than a silently meaningless ranking.

    >>> kb = KnowledgeBase(stores.milvus, redis=stores.redis)
    >>> kb.add_documents("docs", [{"id": "1", "text": "KV caches hold attention keys"}], cache=cache)
    >>> kb.search("docs", "what is a KV cache?", cache=cache, top_k=3).hits[0].id
    '1'
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash
from pymilvus import DataType, MilvusClient

from ragcache.core.cache import EmbeddingCache
from ragcache.core.health import TierHealth
from ragcache.core.keys import EmbeddingSpace
from ragcache.errors import ConflictError, InvalidInputError, NotFoundError, RagCacheError, TierUnavailableError
from ragcache.retrieval.documents import (
    CONTENT_HASH_LENGTH,
    MAX_ID_BYTES,
    MAX_TEXT_BYTES,
    Document,
    check_collection_name,
    check_documents,
    check_filter,
    check_ids,
    check_query,
    check_top_k,
    collection_name_from_milvus,
    content_hash,
    milvus_collection_name,
)
from ragcache.retrieval.keyword import SPARSE_FIELD, add_keyword_index, has_keyword_index, keyword_search_params
from ragcache.retrieval.ranking import SearchOptions, finish, fuse, group_hits
from ragcache.retrieval.result_cache import DEFAULT_MAX_VALUE_BYTES, ResultCache
from ragcache.retrieval.results import CollectionInfo, IngestResult, SearchHit, SearchResult, SearchTimings
from ragcache.retrieval.sync import MAX_LISTED_IDS, SyncOptions, source_expression, sources_of
from ragcache.storage.milvus_errors import is_milvus_outage, milvus_error_message, milvus_failures

__all__ = ["KnowledgeBase", "CollectionInfo", "IngestResult", "SearchHit", "SearchOptions", "SearchResult", "SearchTimings"]

# Cosine, not inner product: a space may store unnormalised vectors (normalize=False is the default), and
# sentence-transformers models are trained for cosine similarity. On normalised vectors the two rank
# identically, so nothing is lost; scores are in [-1, 1] either way.
METRIC = "COSINE"
# AUTOINDEX: on Milvus Lite 2.5 it answered top-10 over 100k x 384 in 4.9 ms against FLAT's 17 ms
# (docs/DESIGN.md); on a Milvus server it picks the server's recommended index.
DEFAULT_INDEX_TYPE = "AUTOINDEX"
# Format 2: the primary key is a hash of the document id (see _pk); format 1 used the id itself.
DESCRIPTION_FORMAT = "ragcache.knowledge/2"
# Rows per upsert/get call: at most 256 x 64 KB texts = 16 MB per gRPC message, under Milvus' 64 MB limit.
BATCH_ROWS = 256
STORE = "knowledge"
PK_LENGTH = 32
MAX_QUERIES = 256  # queries in one search_many call
KEYWORD_STORE = "keyword index"
# A process reads a collection's record (space, uid) again after this long, so a collection another process
# dropped and re-created is seen as the new one within it; the re-read is two small Milvus calls.
RECORD_TTL_S = 30.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Collection:
    """What this process knows of one collection; ``uid`` is random per creation."""

    name: str
    milvus_name: str
    space_id: str
    model: str
    dim: int
    uid: str
    hashed: bool = False  # has the content_hash field; collections made before it are compared by their text
    keyword: bool = False  # has the BM25 field (ragcache.retrieval.keyword); collections made before it do not
    read_at: float = field(default=0.0, compare=False)  # when this process read the record (the KB's clock)


@dataclass(frozen=True)
class _Plan:
    """A search's checked arguments."""

    meta: _Collection
    queries: list[str]
    query_keys: list[str]
    params: str  # the result-cache key's parameters: top_k, filter and every option
    expression: str | None
    top_k: int
    options: SearchOptions
    query_cache: EmbeddingCache


@dataclass(frozen=True)
class _Ranked:
    """One query's hits from one ranked list, and their vectors when MMR asked for them."""

    hits: tuple[SearchHit, ...]
    vectors: dict[str, np.ndarray]


class KnowledgeBase:
    """Document collections in one Milvus database (``Stores.milvus``), with an optional Redis result cache.

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
        clock: Callable[[], float] = time.perf_counter,
    ):
        """``keyword_index``: collections created from now on get the BM25 field (``ragcache.retrieval.keyword``), which
        keyword and hybrid search need; it slows Milvus' writes (Milvus Lite: 3,177 -> 846 rows/s)."""
        self.milvus = milvus
        self.keyword_index = keyword_index
        self.results = ResultCache(redis, ttl_s=result_ttl_s, max_value_bytes=result_max_bytes) if redis is not None else None
        self.index_type = index_type
        self.max_top_k = max_top_k
        self.record_ttl_s = record_ttl_s
        self._clock = clock
        self._collections: dict[str, _Collection] = {}
        self._creating: dict[str, threading.Lock] = {}  # one per collection name, held while creating it
        self._lock = threading.Lock()  # guards the two dicts only, never held while Milvus is asked
        self.health = TierHealth()  # the breaker of Milvus as the knowledge base's store
        self.keyword_health = TierHealth()  # the keyword (BM25) searches' own: dense search goes on without them

    # ---- collections -----------------------------------------------------------------------------------

    def create_collection(self, collection: str, *, cache: EmbeddingCache) -> CollectionInfo:
        """Create an empty collection for the cache's space (nothing happens when it exists in that space)."""
        meta = self._ensure(check_collection_name(collection), cache.space)
        return self._info(meta)

    def drop_collection(self, collection: str) -> None:
        """Delete a collection and all its documents."""
        meta = self._lookup(check_collection_name(collection))
        self._call(meta, "drop_collection", meta.milvus_name)
        with self._lock:
            self._collections.pop(meta.name, None)
        if self.results is not None:
            self.results.discard(meta.uid)

    def collection_names(self, *, prefix: str = "") -> list[str]:
        """The names of the knowledge-base collections starting with ``prefix``: one call, nothing read or loaded
        (what a quota needs)."""
        names = (collection_name_from_milvus(milvus_name) for milvus_name in self._milvus("list_collections", collection=None))
        return sorted(name for name in names if name is not None and name.startswith(prefix))

    def list_collections(self, *, prefix: str = "") -> list[CollectionInfo]:
        """The knowledge-base collections whose names start with ``prefix`` (a tenant's), by name.

        Nothing is loaded into memory: a collection's size comes from Milvus' statistics (on a Milvus server
        deleted rows count until a compaction; ``collection_info`` counts exactly). A collection that cannot
        be read is logged and left out, so one broken collection does not hide the others; when every one
        failed, the last failure is raised."""
        milvus_names = self._milvus("list_collections", collection=None)
        infos, failures = [], []
        for milvus_name in sorted(milvus_names):
            name = collection_name_from_milvus(milvus_name)
            if name is None or not name.startswith(prefix):
                continue  # L3 cache collections, anything else in the same database, other tenants'
            try:
                meta = self._read_record(name)
                stats = self._call(meta, "get_collection_stats", meta.milvus_name)
                infos.append(CollectionInfo(meta.name, meta.space_id, meta.model, meta.dim, int(stats["row_count"])))
            except (NotFoundError, ConflictError, InvalidInputError):
                continue  # dropped meanwhile, or not one of ours
            except TierUnavailableError as exc:
                log.warning("collection %r left out of the listing: %s", name, exc)
                failures.append(exc)
        if failures and not infos:
            raise failures[-1]
        return sorted(infos, key=lambda info: info.name)

    def collection_info(self, collection: str) -> CollectionInfo:
        return self._info(self._lookup(check_collection_name(collection)))

    # ---- documents -------------------------------------------------------------------------------------

    def add_documents(
        self,
        collection: str,
        documents: Sequence[Document | dict],
        *,
        cache: EmbeddingCache,
        sync: SyncOptions | None = None,
    ) -> IngestResult:
        """Embed the documents through ``cache`` and upsert them by id, creating the collection if needed.

        A document stored with the same content hash is left alone (nothing embedded or written); ``sync``
        then deletes what is gone from the source (``ragcache.retrieval.sync``)."""
        checked = check_documents(documents)
        meta = self._ensure(check_collection_name(collection), cache.space)
        hashes = [content_hash(document) for document in checked]
        stored = self._stored_hashes(meta, [document.id for document in checked])
        changed = [index for index, document in enumerate(checked) if stored.get(document.id) != hashes[index]]
        num_replaced = sum(1 for index in changed if checked[index].id in stored)
        served: dict[str, int] = {}
        if changed:
            served = self._upsert(meta, [checked[index] for index in changed], [hashes[index] for index in changed], cache)
        num_deleted = 0 if sync is None else self._clean_up(meta, checked, sync)
        num_computed = served.get(cache.level_names[-1], 0)
        return IngestResult(
            collection=meta.name,
            num_received=len(checked),
            num_inserted=len(changed) - num_replaced,
            num_replaced=num_replaced,
            num_cached=len(changed) - num_computed,
            num_computed=num_computed,
            served=served,
            num_unchanged=len(checked) - len(changed),
            num_deleted=num_deleted,
        )

    def _upsert(self, meta: _Collection, documents: list[Document], hashes: list[str], cache: EmbeddingCache) -> dict[str, int]:
        """Embed and upsert; returns how many embeddings each level served."""
        embedded = cache.embed_detailed([document.text for document in documents])
        vectors = np.asarray(embedded.vectors, dtype=np.float32)  # Milvus stores float32 vectors
        rows = [
            {"pk": _pk(document.id), "id": document.id, "text": document.text, "metadata": document.metadata, "vector": vector}
            for document, vector in zip(documents, vectors)
        ]
        if meta.hashed:
            for row, digest in zip(rows, hashes):
                row["content_hash"] = digest
        self._invalidate(meta, written=False)
        try:
            for start in range(0, len(rows), BATCH_ROWS):
                self._call(meta, "upsert", meta.milvus_name, rows[start : start + BATCH_ROWS])
        finally:
            # Also after a partial failure: some batches may have landed, and cached results must not hide them.
            self._invalidate(meta, written=True)
        return embedded.served

    def _stored_hashes(self, meta: _Collection, ids: list[str]) -> dict[str, str]:
        """id -> content hash of the stored documents among ``ids``. A collection made before content hashes
        has its stored text and metadata read and hashed instead (slower, same answer)."""
        fields = ["id", "content_hash"] if meta.hashed else ["id", "text", "metadata"]
        found: dict[str, str] = {}
        for start in range(0, len(ids), BATCH_ROWS):
            batch = ids[start : start + BATCH_ROWS]
            rows = self._call(meta, "get", meta.milvus_name, ids=[_pk(doc_id) for doc_id in batch], output_fields=fields)
            for row in rows:
                stored = row["content_hash"] if meta.hashed else content_hash(Document(row["id"], row["text"], row.get("metadata") or {}))
                found[row["id"]] = stored
        return found

    def _clean_up(self, meta: _Collection, kept: list[Document], sync: SyncOptions) -> int:
        """Delete the documents of the sync's scope that this request did not send; returns how many."""
        if sync.cleanup == "incremental":
            sources = sources_of(kept)
            if not sources:
                return 0
            expression = source_expression(sources)
        else:
            expression = sync.scope or ""
        try:
            listed = self._list_ids(meta, expression)
        except InvalidInputError as exc:
            raise InvalidInputError(f"sync.scope is not a valid filter: {exc}", field="sync.scope") from exc
        kept_ids = {document.id for document in kept}
        return self._delete_existing(meta, [doc_id for doc_id in listed if doc_id not in kept_ids])

    def list_ids(self, collection: str, filter: str | None = None) -> list[str]:  # noqa: A002 - the API's name
        """The ids of the collection's documents (matching ``filter``), at most ``MAX_LISTED_IDS``."""
        meta = self._lookup(check_collection_name(collection))
        return self._list_ids(meta, check_filter(filter) or "")

    def _list_ids(self, meta: _Collection, expression: str) -> list[str]:
        filter_given = bool(expression)
        iterator = self._call(
            meta, "query_iterator", meta.milvus_name, batch_size=1000, filter=expression, output_fields=["id"],
            filter_given=filter_given,
        )
        ids: list[str] = []
        try:
            while batch := self._next_batch(meta, iterator, filter_given):
                ids.extend(row["id"] for row in batch)
                if len(ids) > MAX_LISTED_IDS:
                    raise InvalidInputError(
                        f"more than {MAX_LISTED_IDS} documents match: narrow the filter (or sync scope)", field="filter"
                    )
        finally:
            iterator.close()
        return ids

    def _next_batch(self, meta: _Collection, iterator: Any, filter_given: bool) -> list[dict]:
        """The iterator's next page, its failures converted and counted like any Milvus call's."""
        try:
            batch = iterator.next()
        except milvus_failures as exc:
            error = _converted(exc, meta.name, filter_given=filter_given)
            self._note(error)
            raise error from exc
        self._note(None)
        return batch

    def get_documents(self, collection: str, ids: Sequence[str]) -> list[Document]:
        """The documents with these ids, in the order asked (repeats folded); unknown ids are left out."""
        checked = check_ids(ids)
        return in_order_asked(checked, [document for batch in self.document_batches(collection, checked) for document in batch])

    def document_batches(self, collection: str, ids: Sequence[str]) -> Iterator[list[Document]]:
        """``get_documents`` one Milvus call at a time (``BATCH_ROWS`` ids each, unknown ids left out), so that a
        caller with a byte budget can stop reading as soon as it is spent."""
        checked = check_ids(ids)
        meta = self._lookup(check_collection_name(collection))
        for start in range(0, len(checked), BATCH_ROWS):
            pks = [_pk(doc_id) for doc_id in checked[start : start + BATCH_ROWS]]
            rows = self._call(meta, "get", meta.milvus_name, ids=pks, output_fields=["id", "text", "metadata"])
            yield [Document(row["id"], row["text"], row.get("metadata") or {}) for row in rows]

    def delete_documents(self, collection: str, ids: Sequence[str]) -> int:
        """Delete documents by id; returns how many existed (unknown ids are ignored)."""
        checked = check_ids(ids)
        meta = self._lookup(check_collection_name(collection))
        return self._delete_existing(meta, checked)

    def _delete_existing(self, meta: _Collection, ids: list[str]) -> int:
        # Milvus reports every requested id as deleted, so the count comes from asking which exist.
        existing = self._existing_ids(meta, ids)
        if existing:
            self._invalidate(meta, written=False)
            try:
                for start in range(0, len(existing), BATCH_ROWS):
                    pks = [_pk(doc_id) for doc_id in existing[start : start + BATCH_ROWS]]
                    self._call(meta, "delete", meta.milvus_name, ids=pks)
            finally:
                self._invalidate(meta, written=True)
        return len(existing)

    def search(
        self,
        collection: str,
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
        return self.search_many(
            collection, [query], cache=cache, top_k=top_k, filter=filter, options=options, query_cache=query_cache,
            with_text=with_text,
        )[0]

    def search_many(
        self,
        collection: str,
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
        plan = self._plan(collection, queries, cache, query_cache, top_k, filter, options, self._lookup)
        assert plan is not None  # _lookup finds the collection or raises
        started = self._clock()
        results: list[SearchResult | None] = [None] * len(plan.queries)
        versions: list[int | None] = [None] * len(plan.queries)
        if self.results is not None:
            for index, query_key in enumerate(plan.query_keys):
                cached, versions[index] = self.results.get(plan.meta.uid, query_key, plan.params)
                if cached is not None:
                    results[index] = self._cached_result(cached, started, plan.options)
        fresh = [index for index, result in enumerate(results) if result is None]
        if fresh:
            for index, result in zip(fresh, self._search_fresh(plan, fresh, started, with_text)):
                version = versions[index]
                results[index] = dataclasses.replace(result, result_cache="off" if version is None else "miss")
                # A degraded answer is not kept, nor one without its texts (a later caller may want them).
                if version is not None and self.results is not None and result.fallback is None and with_text:
                    value = [[h.id, h.score, h.text, h.metadata] for h in result.hits]
                    self.results.put(plan.meta.uid, version, plan.query_keys[index], plan.params, value)
        return [result for result in results if result is not None]  # every one is set by now

    async def search_cached(
        self,
        collection: str,
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
        if self.results is None:
            return None
        plan = self._plan(collection, [query], cache, query_cache, top_k, filter, options, self._known)
        if plan is None:
            return None  # not yet known in this process: finding it asks Milvus, which blocks
        started = self._clock()
        cached = await self.results.aget(plan.meta.uid, plan.query_keys[0], plan.params)
        return None if cached is None else self._cached_result(cached, started, plan.options)

    def _plan(self, collection, queries, cache, query_cache, top_k, filter, options, find) -> _Plan | None:  # noqa: A002
        """The search's checked arguments (every one checked before Milvus is asked); None when ``find``
        does not know the collection."""
        name = check_collection_name(collection)
        checked = _check_queries(queries)
        top_k = check_top_k(top_k, self.max_top_k)
        expression = check_filter(filter)
        options = options or SearchOptions()
        query_cache = query_cache or cache
        _check_query_space(cache.space, query_cache.space)
        meta = find(name)
        if meta is None:
            return None
        _check_space(meta, cache.space)
        if options.uses_keyword and not meta.keyword:
            raise InvalidInputError(
                f"mode={options.mode!r} needs a keyword index, and collection {meta.name!r} was created without one "
                "(before ragcache kept one): search it with mode='dense', or ingest into a new collection",
                field="mode",
            )
        query_keys = query_cache.space.keys(query_cache.space.prepare(checked))
        params = json.dumps([top_k, expression, options.key()], sort_keys=True)
        return _Plan(meta, checked, query_keys, params, expression, top_k, options, query_cache)

    def _search_fresh(self, plan: _Plan, fresh: list[int], started: float, with_text: bool) -> list[SearchResult]:
        """Search Milvus for the queries at ``fresh``: the keyword list first (so that its failure can turn
        the search dense before anything is embedded), then the query vectors and the dense list."""
        meta, options, texts = plan.meta, plan.options, [plan.queries[index] for index in fresh]
        limit, with_vectors = options.num_candidates(plan.top_k), options.mmr_lambda is not None
        keyword: list[_Ranked] = [_Ranked((), {})] * len(texts)
        fallback = None
        search_s = 0.0
        if options.uses_keyword:
            keyword_started = self._clock()
            try:
                keyword = self._ranked(meta, SPARSE_FIELD, texts, limit, plan.expression, with_vectors, with_text)
            except TierUnavailableError as exc:
                fallback = f"keyword search failed, so dense search answered: {exc}"
                log.warning("collection %r: %s", meta.name, fallback)
                options = dataclasses.replace(options, mode="dense")
            search_s += self._clock() - keyword_started
        embed_started = self._clock()
        levels: list[str | None] = [None] * len(texts)
        vectors = None
        if options.uses_dense or with_vectors:
            embedded = plan.query_cache.embed_detailed(texts)
            vectors = np.asarray(embedded.vectors, dtype=np.float32)  # Milvus searches float32 vectors
            levels = [embedded.level_names[int(level)] for level in embedded.levels]
        dense_started = self._clock()
        dense: list[_Ranked] = [_Ranked((), {})] * len(texts)
        if options.uses_dense and vectors is not None:
            dense = self._ranked(meta, "vector", list(vectors), limit, plan.expression, with_vectors, with_text)
        finished = self._clock()
        search_s += finished - dense_started
        timings = SearchTimings(embed=_ms(dense_started - embed_started), search=_ms(search_s), total=_ms(finished - started))
        results = []
        for position in range(len(texts)):
            ranked = fuse(options, dense[position].hits, keyword[position].hits)
            hits = finish(
                options,
                ranked,
                plan.top_k,
                query_vector=None if vectors is None else vectors[position],
                vectors={**keyword[position].vectors, **dense[position].vectors},
            )
            groups = group_hits(hits, options.group_size) if options.group_by_source else None
            results.append(SearchResult(hits, levels[position], timings, "miss", options.mode, fallback, groups))
        return results

    def _cached_result(self, cached, started: float, options: SearchOptions) -> SearchResult | None:
        hits = _hits_from_json(cached)
        if hits is None:
            return None
        elapsed_ms = _ms(self._clock() - started)
        groups = group_hits(hits, options.group_size) if options.group_by_source else None
        return SearchResult(hits, None, SearchTimings(0.0, elapsed_ms, elapsed_ms), "hit", options.mode, None, groups)

    def _ranked(
        self, meta: _Collection, field: str, data: list, limit: int, expression: str | None, with_vectors: bool,
        with_text: bool = True,
    ) -> list[_Ranked]:
        """One ranked list per query: the nearest rows of ``field`` (``vector``: cosine; the sparse field:
        BM25 of the query's text), with their vectors when asked (for MMR), without their texts when not."""
        output_fields = ["id", *(["text"] if with_text else []), "metadata", *(["vector"] if with_vectors else [])]
        arguments: dict[str, Any] = dict(data=data, anns_field=field, limit=limit, filter=expression or "", output_fields=output_fields)
        if field == SPARSE_FIELD:
            rows_per_query = self._keyword_search(meta, filter_given=expression is not None, **arguments)
        else:
            arguments["search_params"] = {"metric_type": METRIC}
            rows_per_query = self._call(meta, "search", meta.milvus_name, filter_given=expression is not None, **arguments)
        ranked = []
        for rows in rows_per_query:
            hits = tuple(
                SearchHit(row["entity"]["id"], float(row["distance"]), row["entity"].get("text", ""), row["entity"].get("metadata") or {})
                for row in rows
            )
            vectors = (
                {row["entity"]["id"]: np.asarray(row["entity"]["vector"], dtype=np.float32) for row in rows}
                if with_vectors
                else {}
            )
            ranked.append(_Ranked(hits, vectors))
        return ranked

    def _keyword_search(self, meta: _Collection, *, filter_given: bool, **arguments) -> Any:
        """A BM25 search, behind a breaker of its own: a failing keyword index makes searches fall back to
        dense (``TierUnavailableError`` here), and must not mark Milvus down while dense search still works.
        While it is down, keyword searches fall back at once, and one per back-off probes it."""
        if not self.keyword_health.should_try():
            raise TierUnavailableError(KEYWORD_STORE, f"down, retried with back-off: {self.keyword_health.last_error}")
        try:
            rows = self.milvus.search(meta.milvus_name, search_params=keyword_search_params(), **arguments)
        except milvus_failures as exc:
            error = _converted(exc, meta.name, filter_given=filter_given)
            if isinstance(error, TierUnavailableError) and self.keyword_health.record_failure(error):
                log.warning("keyword index of %r is failing; keyword searches fall back to dense: %s", meta.name, error)
            raise error from exc
        if self.keyword_health.record_success():
            log.warning("keyword index of %r is back", meta.name)
        return rows

    # ---- internals ---------------------------------------------------------------------------------------

    def _lookup(self, name: str) -> _Collection:
        """The collection's record, read from Milvus (and loaded for search) on first use in this process.

        No lock is held while Milvus is asked: a slow or hung Milvus must not stall every other collection's
        requests behind this one. Two threads may both read a new record; the calls are idempotent, and the
        first record stored wins."""
        meta = self._known(name)
        if meta is not None:
            return meta
        meta = self._read_record(name)
        previous = self._collections.get(name)
        if previous is None or previous.uid != meta.uid:
            # A collection must be loaded before search or get; after a restart (or a re-creation) it is not.
            self._milvus("load_collection", meta.milvus_name, collection=name)
        with self._lock:
            self._collections[name] = meta
        return meta

    def _known(self, name: str) -> _Collection | None:
        """This process's record of the collection, unless older than ``record_ttl_s``: another process may
        have dropped and re-created it since (a new uid for the result cache, perhaps another space)."""
        meta = self._collections.get(name)
        if meta is None or self._clock() - meta.read_at > self.record_ttl_s:
            return None
        return meta

    def _read_record(self, name: str) -> _Collection:
        """The collection's record as Milvus describes it now (nothing is loaded)."""
        milvus_name = milvus_collection_name(name)
        if not self._milvus("has_collection", milvus_name, collection=name):
            raise NotFoundError(f"collection {name!r} does not exist")
        described = self._milvus("describe_collection", milvus_name, collection=name)
        return dataclasses.replace(_parse_description(name, milvus_name, described), read_at=self._clock())

    def _ensure(self, name: str, space: EmbeddingSpace) -> _Collection:
        """The collection, created for ``space`` when missing; ``ConflictError`` when it has another space."""
        try:
            meta = self._lookup(name)
        except NotFoundError:
            meta = self._create(name, space)
        _check_space(meta, space)
        return meta

    def _create(self, name: str, space: EmbeddingSpace) -> _Collection:
        milvus_name = milvus_collection_name(name)
        description = {
            "format": DESCRIPTION_FORMAT,
            "name": name,
            "space_id": space.space_id,
            "model": space.model,
            "dim": space.dim,
            "uid": secrets.token_hex(8),
        }
        schema = MilvusClient.create_schema(
            auto_id=False, enable_dynamic_field=False, description=json.dumps(description)
        )
        schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=PK_LENGTH)
        schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES, enable_analyzer=self.keyword_index)
        schema.add_field("metadata", DataType.JSON)
        schema.add_field("content_hash", DataType.VARCHAR, max_length=CONTENT_HASH_LENGTH)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=space.dim)
        index_params = MilvusClient.prepare_index_params()
        index_params.add_index(field_name="vector", index_type=self.index_type, metric_type=METRIC)
        if self.keyword_index:
            add_keyword_index(schema, index_params)
        # One creation at a time per name (two would race to write different descriptions); other
        # collections go on meanwhile, and each call here has the Milvus deadline.
        with self._lock:
            creating = self._creating.setdefault(name, threading.Lock())
        with creating:
            if not self._milvus("has_collection", milvus_name, collection=name):
                # Strong consistency: a search right after an ingest sees the ingested documents.
                self._milvus("create_collection", milvus_name, schema=schema, index_params=index_params,
                             consistency_level="Strong", collection=name)
        return self._lookup(name)  # also when another process created it first: its record wins

    def _existing_ids(self, meta: _Collection, ids: list[str]) -> list[str]:
        found: set[str] = set()
        for start in range(0, len(ids), BATCH_ROWS):
            batch = ids[start : start + BATCH_ROWS]
            rows = self._call(meta, "get", meta.milvus_name, ids=[_pk(doc_id) for doc_id in batch], output_fields=["id"])
            found.update(row["id"] for row in rows)
        return [doc_id for doc_id in ids if doc_id in found]

    def _info(self, meta: _Collection) -> CollectionInfo:
        rows = self._call(meta, "query", meta.milvus_name, filter="", output_fields=["count(*)"])
        return CollectionInfo(meta.name, meta.space_id, meta.model, meta.dim, int(rows[0]["count(*)"]))

    def _invalidate(self, meta: _Collection, *, written: bool) -> None:
        """Bump the collection's result version, before a write (a Redis that cannot take it refuses the write
        before anything changed) and after it (a search during the write may have cached the old contents).
        Every replica reads the same version key, so a write whose bump failed must not be acknowledged."""
        if self.results is None:
            return
        try:
            self.results.bump(meta.uid)
        except TierUnavailableError as exc:
            outcome = ("the change may have landed, and searches on other replicas may show the old contents until it is "
                       "repeated: retry the request") if written else "nothing was changed: retry when Redis is back"
            raise TierUnavailableError(
                "result cache", f"cached search results of collection {meta.name!r} could not be invalidated; {outcome}"
            ) from exc

    def _call(self, meta: _Collection, method: str, *args, filter_given: bool = False, **kwargs) -> Any:
        """Call a Milvus method on a known collection; one another process dropped is forgotten here too."""
        try:
            return self._milvus(method, *args, collection=meta.name, filter_given=filter_given, **kwargs)
        except NotFoundError:
            with self._lock:
                self._collections.pop(meta.name, None)
            raise

    def _milvus(self, method: str, *args, collection: str | None, filter_given: bool = False, **kwargs) -> Any:
        """Call the Milvus client's ``method`` behind the circuit breaker, converting its failures.

        A failure of Milvus itself (refused, timed out: the client gives every call a deadline) opens the
        breaker, and until a probe succeeds the knowledge base answers at once with ``TierUnavailableError``
        rather than making each request wait out the deadline. An answer that is an error status (no such
        collection, a bad filter, an engine error) is Milvus working: it closes the breaker."""
        if not self.health.should_try():
            raise TierUnavailableError(STORE, f"Milvus is down (retry when it is back): {self.health.last_error}")
        try:
            result = getattr(self.milvus, method)(*args, **kwargs)
        except milvus_failures as exc:
            error = _converted(exc, collection, filter_given=filter_given)
            # Only no answer opens the breaker: an error status (e.g. an engine error on an odd filter, which
            # the service then tells apart by searching without it) came from a Milvus that is up.
            self._note(error if is_milvus_outage(exc) else None)
            raise error from exc
        except TierUnavailableError as exc:  # a server client that cannot connect (stores.MilvusConnection)
            self._note(exc)
            raise
        self._note(None)
        return result

    def _note(self, error: RagCacheError | None) -> None:
        if isinstance(error, TierUnavailableError):
            if self.health.record_failure(error):
                log.warning("the knowledge base's Milvus is down; requests get 503 until it is back: %s", error)
        elif self.health.record_success():
            log.warning("the knowledge base's Milvus is back")

def _check_space(meta: _Collection, space: EmbeddingSpace) -> None:
    if meta.space_id != space.space_id:
        raise ConflictError(
            f"collection {meta.name!r} holds vectors of embedding space {meta.space_id} "
            f"({meta.model}, {meta.dim}-d), but this cache embeds in space {space.space_id} "
            f"({space.model}, {space.dim}-d); vectors of two spaces cannot be compared. Use the model and "
            "settings the collection was built with, or ingest into another collection" + _drift_hint(space)
        )


def _drift_hint(space: EmbeddingSpace) -> str:
    """Why a collection of the same model no longer matches: the model changed behind its name (drift)."""
    if not space.generation:
        return ""
    return (f". The model changed behind its name since (its space is at generation {space.generation}, "
            "docs/drift.md): the collection's vectors came from the old model; re-ingest its documents")


def _check_queries(queries: object) -> list[str]:
    """Valid queries; one query is named ``query`` (``search``), several ``queries[i]`` (``search_many``)."""
    if isinstance(queries, str) or not isinstance(queries, Sequence) or not 1 <= len(queries) <= MAX_QUERIES:
        raise InvalidInputError(f"queries must be a list of 1 to {MAX_QUERIES} strings", field="queries")
    if len(queries) == 1:
        return [check_query(queries[0])]
    checked = []
    for index, query in enumerate(queries):
        try:
            checked.append(check_query(query))
        except InvalidInputError as exc:
            raise InvalidInputError(str(exc).replace("query", f"queries[{index}]", 1), field=f"queries[{index}]") from exc
    return checked


def _check_query_space(space: EmbeddingSpace, query_space: EmbeddingSpace) -> None:
    """A query cache must be the documents' model and settings, differing at most in the prompt."""
    if dataclasses.replace(query_space, prompt=None) != dataclasses.replace(space, prompt=None):
        raise ConflictError(
            f"the query is embedded in space {query_space.space_id} ({query_space.model}), which is not the "
            f"documents' space {space.space_id} ({space.model}) under another prompt: their vectors cannot be compared"
        )


def in_order_asked(ids: Sequence[str], documents: Iterable[Document]) -> list[Document]:
    """``documents`` in the order of ``ids`` (repeats folded); ids without a document are left out."""
    found = {document.id: document for document in documents}
    return [found[doc_id] for doc_id in dict.fromkeys(ids) if doc_id in found]


def _pk(document_id: str) -> str:
    """The primary key of a document: xxh3-128 of its id. Milvus Lite builds the expressions behind upsert,
    get and delete from primary keys without escaping them, so an id with a quote or a non-ASCII character
    broke those calls; the hash is always plain hex, and the id itself is stored in its own field."""
    return xxhash.xxh3_128_hexdigest(document_id.encode("utf-8"))


def _parse_description(name: str, milvus_name: str, described: dict) -> _Collection:
    try:
        record = json.loads(described.get("description") or "")
        found = record.get("format")
        if isinstance(found, str) and found.startswith("ragcache.knowledge/") and found != DESCRIPTION_FORMAT:
            raise ConflictError(
                f"collection {name!r} was written by another ragcache version ({found}, this one reads "
                f"{DESCRIPTION_FORMAT}): ingest into a new collection, or drop it and ingest again"
            )
        if found != DESCRIPTION_FORMAT:
            raise ValueError(found)
        hashed = any(field.get("name") == "content_hash" for field in described.get("fields", []))
        return _Collection(name, milvus_name, record["space_id"], record["model"], int(record["dim"]), record["uid"],
                           hashed=hashed, keyword=has_keyword_index(described))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConflictError(f"Milvus collection {milvus_name!r} exists but is not a ragcache knowledge base") from exc


def _converted(exc: BaseException, name: str | None, *, filter_given: bool = False) -> RagCacheError:
    code = getattr(exc, "code", None)
    message = milvus_error_message(exc)
    if name is not None and (code == 100 or "collection not found" in message.lower()):
        return NotFoundError(f"collection {name!r} does not exist")
    # Milvus answers a filter it cannot parse or type-check with 1100 (invalid parameter) or a message
    # about the expression; anything else (unreachable, timed out, ...) is the store failing.
    if filter_given and (code == 1100 or "expr" in message.lower()):
        return InvalidInputError(f"filter is not a valid Milvus expression: {message.strip()}", field="filter")
    where = "" if name is None else f" on collection {name!r}"
    return TierUnavailableError(STORE, f"Milvus failed{where} (retry when it is back): {message}")


def _hits_from_json(value: Any) -> tuple[SearchHit, ...] | None:
    """Hits from a cached result list; None when the value is not one (then the search runs)."""
    try:
        return tuple(SearchHit(str(i), float(s), str(t), dict(m)) for i, s, t, m in value)
    except (TypeError, ValueError):
        return None


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
