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

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash
from pymilvus import DataType, MilvusClient

from ragcache.cache import EmbeddingCache
from ragcache.documents import (
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
from ragcache.errors import ConflictError, InvalidInputError, NotFoundError, RagCacheError, TierUnavailableError
from ragcache.keys import EmbeddingSpace
from ragcache.result_cache import ResultCache
from ragcache.results import CollectionInfo, IngestResult, SearchHit, SearchResult, SearchTimings
from ragcache.sync import MAX_LISTED_IDS, SyncOptions, source_expression, sources_of
from ragcache.tiers.base import TierHealth
from ragcache.tiers.milvus import milvus_error_message, milvus_failures

__all__ = ["KnowledgeBase", "CollectionInfo", "IngestResult", "SearchHit", "SearchResult", "SearchTimings"]

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
        index_type: str = DEFAULT_INDEX_TYPE,
        max_top_k: int = 1000,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.milvus = milvus
        self.results = ResultCache(redis, ttl_s=result_ttl_s) if redis is not None else None
        self.index_type = index_type
        self.max_top_k = max_top_k
        self._clock = clock
        self._collections: dict[str, _Collection] = {}
        self._creating: dict[str, threading.Lock] = {}  # one per collection name, held while creating it
        self._lock = threading.Lock()  # guards the two dicts only, never held while Milvus is asked
        self.health = TierHealth()  # the breaker of Milvus as the knowledge base's store

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

    def list_collections(self) -> list[CollectionInfo]:
        """Every knowledge-base collection in the database, by name."""
        milvus_names = self._milvus("list_collections", collection=None)
        infos = []
        for milvus_name in milvus_names:
            name = collection_name_from_milvus(milvus_name)
            if name is None:
                continue  # L3 cache collections and anything else in the same database
            try:
                infos.append(self.collection_info(name))
            except (NotFoundError, ConflictError, InvalidInputError):
                continue  # dropped meanwhile, or not one of ours
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
        then deletes what is gone from the source (``ragcache.sync``)."""
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
    ) -> SearchResult:
        """The ``top_k`` documents nearest to ``query``, optionally filtered by a Milvus boolean expression
        (e.g. ``metadata["lang"] == "en"``)."""
        meta, query_key, params, expression = self._prepare_search(collection, query, cache, top_k, filter, self._lookup)
        started = self._clock()
        cached, version = (None, None) if self.results is None else self.results.get(meta.uid, query_key, params)
        if cached is not None and (hit := self._cached_result(cached, started)) is not None:
            return hit

        embed_started = self._clock()
        embedded = cache.embed_detailed([query])
        level = embedded.level_names[int(embedded.levels[0])]
        search_started = self._clock()
        hits = self._nearest(meta, np.asarray(embedded.vectors, dtype=np.float32)[0], top_k, expression)
        finished = self._clock()
        if version is not None and self.results is not None:
            self.results.put(meta.uid, version, query_key, params, [[h.id, h.score, h.text, h.metadata] for h in hits])
        embed_ms, search_ms = _ms(search_started - embed_started), _ms(finished - search_started)
        timings = SearchTimings(embed=embed_ms, search=search_ms, total=_ms(finished - started))
        return SearchResult(hits, level, timings, "off" if version is None else "miss")

    async def search_cached(
        self,
        collection: str,
        query: str,
        *,
        cache: EmbeddingCache,
        top_k: int = 10,
        filter: str | None = None,  # noqa: A002 - the public name of the parameter, as in the HTTP API
    ) -> SearchResult | None:
        """The cached result of ``search`` with these arguments, found without blocking (for an event loop);
        None when there is none (or it cannot be had without blocking): then call ``search``."""
        if self.results is None:
            return None
        prepared = self._prepare_search(collection, query, cache, top_k, filter, self._collections.get)
        if prepared[0] is None:
            return None  # not yet known in this process: finding it asks Milvus, which blocks
        meta, query_key, params, _ = prepared
        started = self._clock()
        cached = await self.results.aget(meta.uid, query_key, params)
        return None if cached is None else self._cached_result(cached, started)

    def _prepare_search(self, collection, query, cache, top_k, filter, find):  # noqa: A002
        """Validated search arguments: (collection record or None, query key, params, filter expression)."""
        name = check_collection_name(collection)
        query = check_query(query)
        top_k = check_top_k(top_k, self.max_top_k)
        expression = check_filter(filter)
        meta = find(name)
        if meta is not None:
            _check_space(meta, cache.space)
        query_key = cache.space.keys(cache.space.prepare([query]))[0]
        return meta, query_key, json.dumps([top_k, expression]), expression

    def _cached_result(self, cached, started: float) -> SearchResult | None:
        hits = _hits_from_json(cached)
        if hits is None:
            return None
        elapsed_ms = _ms(self._clock() - started)
        return SearchResult(hits, None, SearchTimings(0.0, elapsed_ms, elapsed_ms), "hit")

    def _nearest(
        self, meta: _Collection, vector: np.ndarray, top_k: int, expression: str | None
    ) -> tuple[SearchHit, ...]:
        rows = self._call(
            meta,
            "search",
            meta.milvus_name,
            data=[vector],
            anns_field="vector",
            limit=top_k,
            filter=expression or "",
            output_fields=["id", "text", "metadata"],
            search_params={"metric_type": METRIC},
            filter_given=expression is not None,
        )[0]
        return tuple(
            SearchHit(row["entity"]["id"], float(row["distance"]), row["entity"]["text"], row["entity"].get("metadata") or {})
            for row in rows
        )

    # ---- internals ---------------------------------------------------------------------------------------

    def _lookup(self, name: str) -> _Collection:
        """The collection's record, read from Milvus (and loaded for search) on first use in this process.

        No lock is held while Milvus is asked: a slow or hung Milvus must not stall every other collection's
        requests behind this one. Two threads may both read a new record; the calls are idempotent, and the
        first record stored wins."""
        meta = self._collections.get(name)
        if meta is not None:
            return meta
        milvus_name = milvus_collection_name(name)
        if not self._milvus("has_collection", milvus_name, collection=name):
            raise NotFoundError(f"collection {name!r} does not exist")
        meta = _parse_description(name, milvus_name, self._milvus("describe_collection", milvus_name, collection=name))
        # A collection must be loaded before search or get; after a restart it is not.
        self._milvus("load_collection", milvus_name, collection=name)
        with self._lock:
            return self._collections.setdefault(name, meta)

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
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
        schema.add_field("metadata", DataType.JSON)
        schema.add_field("content_hash", DataType.VARCHAR, max_length=CONTENT_HASH_LENGTH)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=space.dim)
        index_params = MilvusClient.prepare_index_params()
        index_params.add_index(field_name="vector", index_type=self.index_type, metric_type=METRIC)
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
        rather than making each request wait out the deadline. An answer that is an error about the request
        (no such collection, a bad filter) is Milvus working: it closes the breaker."""
        if not self.health.should_try():
            raise TierUnavailableError(STORE, f"Milvus is down (retry when it is back): {self.health.last_error}")
        try:
            result = getattr(self.milvus, method)(*args, **kwargs)
        except milvus_failures as exc:
            error = _converted(exc, collection, filter_given=filter_given)
            self._note(error)
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
            "settings the collection was built with, or ingest into another collection"
        )


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
        return _Collection(name, milvus_name, record["space_id"], record["model"], int(record["dim"]), record["uid"], hashed)
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
