"""A knowledge base's documents: embedded through an ``EmbeddingCache`` and upserted by id, read, listed, deleted,
and synced with their source (``ragcache.retrieval.sync``).

Every write invalidates the collection's cached search results (``ResultCache``), before and after it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragcache.core.cache import EmbeddingCache
from ragcache.errors import InvalidInputError, QuotaExceededError, TierUnavailableError
from ragcache.observe.logs import DropMessages
from ragcache.retrieval.catalog import Catalog, CollectionRecord
from ragcache.retrieval.documents import (
    Document,
    check_documents,
    check_filter,
    check_ids,
    content_hash,
)
from ragcache.retrieval.names import CollectionName, tenant_of, tenant_prefix
from ragcache.retrieval.result_cache import ResultCache
from ragcache.retrieval.results import IngestResult
from ragcache.retrieval.sync import MAX_LISTED_IDS, SyncOptions, source_expression, sources_of

# pymilvus' query_iterator (listing a collection's ids) asks the server for a snapshot timestamp; Milvus Lite has none
# to give, and pymilvus then warns at every listing that it uses the client's clock instead. Harmless: the listing
# reads what was written before it either way (Milvus Lite has one writer, and a server's answer is the same snapshot).
logging.getLogger("pymilvus.orm.iterator").addFilter(DropMessages("failed to get mvccTs from milvus server"))

__all__ = ["BATCH_ROWS", "DocumentQuota", "DocumentStore", "in_order_asked"]

# Rows per upsert/get call: at most 256 x 64 KB texts = 16 MB per gRPC message, under Milvus' 64 MB limit.
BATCH_ROWS = 256


@dataclass(frozen=True)
class DocumentQuota:
    """The most documents (rows) one collection and one tenant's collections together may hold (None: no bound), and
    the free space an ingest must leave on the volume that holds the collections (None: not checked).

    Without them, anyone allowed to ingest could fill the data volume (``milvus.db`` grew without bound, and a full
    volume took the service down with it). Rows, not bytes, per collection and tenant: a stored row's bytes are
    bounded already (a text at most ``max_text_bytes``, the metadata's bounds, one vector), so the rows bound the
    bytes; Milvus counts rows in one call, while the bytes of what a collection holds it cannot sum. What the rows
    leave open at their defaults (1,000,000 rows of up to 64 KiB texts) the volume check closes: an ingest whose
    own bytes would leave less than ``min_free_bytes`` free is refused, whoever sends it.

    ``volume_free_bytes``: the free bytes of the volume that holds the collections (an embedded Milvus Lite's
    folder; None for a Milvus server, whose volume is its own)."""

    max_collection_documents: int | None = None
    max_tenant_documents: int | None = None
    min_free_bytes: int | None = None
    volume_free_bytes: Callable[[], int] | None = None


def stored_bytes(documents: Sequence[Document], dim: int) -> int:
    """What ``documents`` take as rows, before Milvus' own overhead: texts, metadata as JSON, ids and vectors."""
    return sum(len(document.text.encode("utf-8")) + len(json.dumps(document.metadata, ensure_ascii=False))
               + len(document.id.encode("utf-8")) + 4 * dim for document in documents)


class DocumentStore:
    """The documents of the catalog's collections, with the result cache they invalidate (None: no cache), within
    ``quota``."""

    def __init__(self, catalog: Catalog, results: ResultCache | None, quota: DocumentQuota | None = None):
        self.catalog = catalog
        self.results = results
        self.quota = quota or DocumentQuota()

    def add_documents(
        self, collection: str | CollectionName, documents: Sequence[Document | dict], cache: EmbeddingCache,
        sync: SyncOptions | None,
    ) -> IngestResult:
        """``KnowledgeBase.add_documents``: a document stored with the same content hash is left alone (nothing
        embedded or written); ``sync`` then deletes what is gone from the source."""
        checked = check_documents(documents)
        meta = self.catalog.ensure(CollectionName.of(collection), cache.space)
        hashes = [content_hash(document) for document in checked]
        stored = self._stored_hashes(meta, [document.id for document in checked])
        changed = [index for index, document in enumerate(checked) if stored.get(document.id) != hashes[index]]
        num_replaced = sum(1 for index in changed if checked[index].id in stored)
        self._check_room(meta, [checked[index] for index in changed])
        self._check_quota(meta, len(changed) - num_replaced)
        served: dict[str, int] = {}
        if changed:
            served = self._upsert(meta, [checked[index] for index in changed], [hashes[index] for index in changed], cache)
        num_deleted = 0 if sync is None else self._clean_up(meta, checked, sync)
        num_computed = served.get(cache.level_names[-1], 0)
        return IngestResult(
            collection=meta.public,
            num_received=len(checked),
            num_inserted=len(changed) - num_replaced,
            num_replaced=num_replaced,
            num_cached=len(changed) - num_computed,
            num_computed=num_computed,
            served=served,
            num_unchanged=len(checked) - len(changed),
            num_deleted=num_deleted,
        )

    def _count(self, meta: CollectionRecord) -> int:
        rows = self.catalog.call(meta, "query", meta.milvus_name, filter="", output_fields=["count(*)"], consistency_level="Strong")
        return int(rows[0]["count(*)"])

    def _check_room(self, meta: CollectionRecord, documents: Sequence[Document]) -> None:
        """``QuotaExceededError`` when writing ``documents`` would leave the volume under ``min_free_bytes`` free
        (checked before anything is embedded or written; replacements count too: Milvus appends, then compacts)."""
        quota = self.quota
        if not documents or quota.min_free_bytes is None or quota.volume_free_bytes is None:
            return
        needed, free = stored_bytes(documents, meta.dim), quota.volume_free_bytes()
        if free - needed < quota.min_free_bytes:
            raise QuotaExceededError(
                f"the data volume has {free} bytes free; these {len(documents)} documents ({needed} bytes) would leave "
                f"less than {quota.min_free_bytes} (RAGCACHE_INGEST_MIN_FREE_BYTES): free space, or delete documents",
                field="documents")

    def _check_quota(self, meta: CollectionRecord, num_new: int) -> None:
        """``QuotaExceededError`` when ``num_new`` more documents would pass the collection's or its tenant's bound.
        Checked before anything is embedded or written, not under a lock: two ingests racing may pass it together
        (by at most one request's documents, itself bounded by ``max_batch``)."""
        quota = self.quota
        if num_new <= 0 or (quota.max_collection_documents is None and quota.max_tenant_documents is None):
            return
        held = self._count(meta)
        if quota.max_collection_documents is not None and held + num_new > quota.max_collection_documents:
            raise QuotaExceededError(
                f"collection {meta.public!r} holds {held} documents; {num_new} more would pass its quota of "
                f"{quota.max_collection_documents} (RAGCACHE_COLLECTION_MAX_DOCUMENTS): delete documents, or use another "
                "collection", field="documents")
        tenant = tenant_of(meta.name) if meta.name != meta.public else None
        if tenant is None or quota.max_tenant_documents is None:
            return
        for name in self.catalog.collection_names(prefix=tenant_prefix(tenant)):  # at most the tenant's collection quota
            if name != meta.name:
                held += self._count(self.catalog.lookup(CollectionName(name, name)))
        if held + num_new > quota.max_tenant_documents:
            raise QuotaExceededError(
                f"this tenant's collections hold {held} documents; {num_new} more would pass its quota of "
                f"{quota.max_tenant_documents} (RAGCACHE_TENANT_MAX_DOCUMENTS): delete documents or collections", field="documents")

    def list_ids(self, collection: str | CollectionName, filter: str | None = None) -> list[str]:  # noqa: A002 - the API's name
        """The ids of the collection's documents (matching ``filter``), at most ``MAX_LISTED_IDS``."""
        meta = self.catalog.lookup(CollectionName.of(collection))
        return self._list_ids(meta, check_filter(filter) or "")

    def get_documents(self, collection: str | CollectionName, ids: Sequence[str]) -> list[Document]:
        """The documents with these ids, in the order asked (repeats folded); unknown ids are left out."""
        checked = check_ids(ids)
        meta = self.catalog.lookup(CollectionName.of(collection))
        return in_order_asked(checked, [document for batch in self._documents_of(meta, checked) for document in batch])

    def document_batches(self, collection: str | CollectionName, ids: Sequence[str]) -> Iterator[list[Document]]:
        """``get_documents`` one Milvus call at a time (``BATCH_ROWS`` ids each, unknown ids left out), so that a
        caller with a byte budget can stop reading as soon as it is spent."""
        checked = check_ids(ids)
        meta = self.catalog.lookup(CollectionName.of(collection))
        yield from self._documents_of(meta, checked)

    def _documents_of(self, meta: CollectionRecord, ids: list[str]) -> Iterator[list[Document]]:
        """The stored documents among ``ids`` (checked), one Milvus call of ``BATCH_ROWS`` ids at a time."""
        for rows in self._rows_of(meta, ids, ["id", "text", "metadata"]):
            yield [Document(row["id"], row["text"], row.get("metadata") or {}) for row in rows]

    def delete_documents(self, collection: str | CollectionName, ids: Sequence[str]) -> int:
        """Delete documents by id; returns how many existed (unknown ids are ignored)."""
        checked = check_ids(ids)
        meta = self.catalog.lookup(CollectionName.of(collection))
        return self._delete_existing(meta, checked)

    def _upsert(
        self, meta: CollectionRecord, documents: list[Document], hashes: list[str], cache: EmbeddingCache
    ) -> dict[str, int]:
        """Embed and upsert; returns how many embeddings each level served."""
        embedded = cache.embed_detailed([document.text for document in documents])
        vectors = np.asarray(embedded.vectors, dtype=np.float32)  # Milvus stores float32 vectors
        rows = [
            {"pk": meta.primary_key(document.id), "id": document.id, "text": document.text, "metadata": document.metadata,
             "vector": vector}
            for document, vector in zip(documents, vectors)
        ]
        if meta.hashed:
            for row, digest in zip(rows, hashes):
                row["content_hash"] = digest
        self._invalidate(meta, written=False)
        try:
            for start in range(0, len(rows), BATCH_ROWS):
                self.catalog.call(meta, "upsert", meta.milvus_name, rows[start : start + BATCH_ROWS])
        finally:
            # Also after a partial failure: some batches may have landed, and cached results must not hide them.
            self._invalidate(meta, written=True)
        return embedded.served

    def _stored_hashes(self, meta: CollectionRecord, ids: list[str]) -> dict[str, str]:
        """id -> content hash of the stored documents among ``ids``. A collection made before content hashes
        has its stored text and metadata read and hashed instead (slower, same answer)."""
        fields = ["id", "content_hash"] if meta.hashed else ["id", "text", "metadata"]
        found: dict[str, str] = {}
        for rows in self._rows_of(meta, ids, fields):
            for row in rows:
                stored = row["content_hash"] if meta.hashed else content_hash(Document(row["id"], row["text"], row.get("metadata") or {}))
                found[row["id"]] = stored
        return found

    def _rows_of(self, meta: CollectionRecord, ids: list[str], fields: list[str]) -> Iterator[list[dict[str, Any]]]:
        """The stored rows of the documents among ``ids`` (their ``fields``), one Milvus call of ``BATCH_ROWS``
        ids at a time."""
        for start in range(0, len(ids), BATCH_ROWS):
            pks = [meta.primary_key(doc_id) for doc_id in ids[start : start + BATCH_ROWS]]
            yield self.catalog.call(meta, "get", meta.milvus_name, ids=pks, output_fields=fields)

    def _clean_up(self, meta: CollectionRecord, kept: list[Document], sync: SyncOptions) -> int:
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

    def _list_ids(self, meta: CollectionRecord, expression: str) -> list[str]:
        filter_given = bool(expression)
        iterator = self.catalog.call(
            meta, "query_iterator", meta.milvus_name, batch_size=1000, filter=expression, output_fields=["id"],
            filter_given=filter_given,
        )
        ids: list[str] = []
        try:
            while batch := self.catalog.gateway.next_page(iterator, meta.public, filter_given):
                ids.extend(row["id"] for row in batch)
                if len(ids) > MAX_LISTED_IDS:
                    raise InvalidInputError(
                        f"more than {MAX_LISTED_IDS} documents match: narrow the filter (or sync scope)", field="filter"
                    )
        finally:
            iterator.close()
        return ids

    def _delete_existing(self, meta: CollectionRecord, ids: list[str]) -> int:
        # Milvus reports every requested id as deleted, so the count comes from asking which exist.
        found = {row["id"] for rows in self._rows_of(meta, ids, ["id"]) for row in rows}
        existing = [doc_id for doc_id in ids if doc_id in found]
        if existing:
            self._invalidate(meta, written=False)
            try:
                for start in range(0, len(existing), BATCH_ROWS):
                    pks = [meta.primary_key(doc_id) for doc_id in existing[start : start + BATCH_ROWS]]
                    self.catalog.call(meta, "delete", meta.milvus_name, ids=pks)
            finally:
                self._invalidate(meta, written=True)
        return len(existing)

    def _invalidate(self, meta: CollectionRecord, *, written: bool) -> None:
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
                "result cache", f"cached search results of collection {meta.public!r} could not be invalidated; {outcome}"
            ) from exc


def in_order_asked(ids: Sequence[str], documents: Iterable[Document]) -> list[Document]:
    """``documents`` in the order of ``ids`` (repeats folded); ids without a document are left out."""
    found = {document.id: document for document in documents}
    return [found[doc_id] for doc_id in dict.fromkeys(ids) if doc_id in found]
