"""The knowledge base's collections: their schema, creation, listing and dropping, and this process's record of each.

A collection records, in its Milvus description, the space its vectors belong to: vectors of two spaces are not
comparable, so using a collection with a cache of another space is a ``ConflictError`` rather than a silently
meaningless ranking.

A collection is asked for by its ``CollectionName`` (``ragcache.retrieval.names``); records are kept by the stored
name, and each caller gets its record with the name it knows (``public``), which every error here says.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash
from pymilvus import DataType, MilvusClient

from ragcache.core.keys import EmbeddingSpace, identity_hash
from ragcache.errors import ConflictError, InvalidInputError, NotFoundError, TierUnavailableError
from ragcache.retrieval.documents import (
    CONTENT_HASH_LENGTH,
    MAX_ID_BYTES,
    MAX_TEXT_BYTES,
    collection_name_from_milvus,
    milvus_collection_name,
)
from ragcache.retrieval.gateway import MilvusGateway
from ragcache.retrieval.keyword import add_keyword_index, has_keyword_index
from ragcache.retrieval.names import CollectionName
from ragcache.retrieval.results import CollectionInfo

__all__ = ["Catalog", "CollectionRecord", "DEFAULT_INDEX_TYPE", "DESCRIPTION_FORMAT", "METRIC", "RECORD_TTL_S",
           "check_space"]

# Cosine, not inner product: a space may store unnormalised vectors (normalize=False is the default), and
# sentence-transformers models are trained for cosine similarity. On normalised vectors the two rank
# identically, so nothing is lost; scores are in [-1, 1] either way.
METRIC = "COSINE"
# AUTOINDEX: on Milvus Lite 2.5 it answered top-10 over 100k x 384 in 4.9 ms against FLAT's 17 ms
# (docs/DESIGN.md); on a Milvus server it picks the server's recommended index.
DEFAULT_INDEX_TYPE = "AUTOINDEX"
# Format 3: the primary key is BLAKE2b-128 of the document id (see CollectionRecord.primary_key); format 2 used
# xxh3-128, which chosen ids can collide (one document replacing another), and is still read with it; format 1
# used the id itself.
DESCRIPTION_FORMAT = "ragcache.knowledge/3"
READABLE_FORMATS = ("ragcache.knowledge/2", DESCRIPTION_FORMAT)
PK_LENGTH = 32
# A process reads a collection's record (space, uid) again after this long, so a collection another process
# dropped and re-created is seen as the new one within it; the re-read is two small Milvus calls.
RECORD_TTL_S = 30.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectionRecord:
    """What this process knows of one collection; ``uid`` is random per creation."""

    name: str
    milvus_name: str
    space_id: str
    model: str
    dim: int
    uid: str
    hashed: bool = False  # has the content_hash field; collections made before it are compared by their text
    keyword: bool = False  # has the BM25 field (ragcache.retrieval.keyword); collections made before it do not
    read_at: float = field(default=0.0, compare=False)  # when this process read the record (the catalog's clock)
    public: str = field(default="", compare=False)  # the name the caller that asked for it knows (its errors say)
    format: str = DESCRIPTION_FORMAT  # the description's format: which hash names its documents

    def primary_key(self, document_id: str) -> str:
        """The primary key of a document: a hash of its id. Milvus Lite builds the expressions behind upsert,
        get and delete from primary keys without escaping them, so an id with a quote or a non-ASCII character
        broke those calls; the hash is always plain hex, and the id itself is stored in its own field."""
        data = document_id.encode("utf-8")
        if self.format == "ragcache.knowledge/2":
            return xxhash.xxh3_128_hexdigest(data)  # what that collection's rows were written under
        return identity_hash(data)


class Catalog:
    """The collections of one Milvus database, and this process's record of each (thread-safe)."""

    def __init__(
        self,
        gateway: MilvusGateway,
        *,
        index_type: str,
        record_ttl_s: float,
        keyword_index: bool,
        clock: Callable[[], float],
    ):
        self.gateway = gateway
        self.index_type = index_type
        self.record_ttl_s = record_ttl_s
        self.keyword_index = keyword_index
        self._clock = clock
        self._collections: dict[str, CollectionRecord] = {}
        self._creating: dict[str, threading.Lock] = {}  # one per collection name, held while creating it
        self._lock = threading.Lock()  # guards the two dicts only, never held while Milvus is asked

    def create_collection(self, name: CollectionName, space: EmbeddingSpace) -> CollectionInfo:
        """Create an empty collection for ``space`` (nothing happens when it exists in that space)."""
        return self._info(self.ensure(name, space))

    def drop_collection(self, name: CollectionName) -> CollectionRecord:
        """Delete a collection and all its documents; returns the record it had."""
        meta = self.lookup(name)
        self.call(meta, "drop_collection", meta.milvus_name)
        with self._lock:
            self._collections.pop(meta.name, None)
        return meta

    def collection_names(self, *, prefix: str = "") -> list[str]:
        """The names of the knowledge-base collections starting with ``prefix``: one call, nothing read or loaded
        (what a quota needs)."""
        milvus_names = self.gateway.call("list_collections", collection=None)
        names = (collection_name_from_milvus(milvus_name) for milvus_name in milvus_names)
        return sorted(name for name in names if name is not None and name.startswith(prefix))

    def list_collections(self, *, prefix: str = "") -> list[CollectionInfo]:
        """The knowledge-base collections whose names start with ``prefix`` (a tenant's), by name.

        Nothing is loaded into memory: a collection's size comes from Milvus' statistics (on a Milvus server
        deleted rows count until a compaction; ``collection_info`` counts exactly). A collection that cannot
        be read is logged and left out, so one broken collection does not hide the others; when every one
        failed, the last failure is raised."""
        milvus_names = self.gateway.call("list_collections", collection=None)
        infos, failures = [], []
        for milvus_name in sorted(milvus_names):
            name = collection_name_from_milvus(milvus_name)
            if name is None or not name.startswith(prefix):
                continue  # L3 cache collections, anything else in the same database, other tenants'
            try:
                meta = self._read_record(CollectionName(name, name))
                stats = self.call(meta, "get_collection_stats", meta.milvus_name)
                infos.append(CollectionInfo(meta.name, meta.space_id, meta.model, meta.dim, int(stats["row_count"])))
            except (NotFoundError, ConflictError, InvalidInputError):
                continue  # dropped meanwhile, or not one of ours
            except TierUnavailableError as exc:
                log.warning("collection %r left out of the listing: %s", name, exc)
                failures.append(exc)
        if failures and not infos:
            raise failures[-1]
        return sorted(infos, key=lambda info: info.name)

    def collection_info(self, name: CollectionName) -> CollectionInfo:
        return self._info(self.lookup(name))

    def lookup(self, name: CollectionName) -> CollectionRecord:
        """The collection's record, read from Milvus (and loaded for search) on first use in this process.

        No lock is held while Milvus is asked: a slow or hung Milvus must not stall every other collection's
        requests behind this one. Two threads may both read a new record; the calls are idempotent, and the
        first record stored wins."""
        meta = self.known(name)
        if meta is not None:
            return meta
        meta = self._read_record(name)
        previous = self._collections.get(name.stored)
        if previous is None or previous.uid != meta.uid:
            # A collection must be loaded before search or get; after a restart (or a re-creation) it is not.
            self.gateway.call("load_collection", meta.milvus_name, collection=name.public)
        with self._lock:
            self._collections[name.stored] = meta
        return meta

    def known(self, name: CollectionName) -> CollectionRecord | None:
        """This process's record of the collection, unless older than ``record_ttl_s``: another process may
        have dropped and re-created it since (a new uid for the result cache, perhaps another space)."""
        meta = self._collections.get(name.stored)
        if meta is None or self._clock() - meta.read_at > self.record_ttl_s:
            return None
        # One record per collection, whoever asks; each caller's copy names it as that caller does.
        return meta if meta.public == name.public else dataclasses.replace(meta, public=name.public)

    def ensure(self, name: CollectionName, space: EmbeddingSpace) -> CollectionRecord:
        """The collection, created for ``space`` when missing; ``ConflictError`` when it has another space."""
        try:
            meta = self.lookup(name)
        except NotFoundError:
            meta = self._create(name, space)
        check_space(meta, space)
        return meta

    def call(self, meta: CollectionRecord, method: str, *args, filter_given: bool = False, **kwargs) -> Any:
        """Call a Milvus method on a known collection; one another process dropped is forgotten here too."""
        try:
            return self.gateway.call(method, *args, collection=meta.public, filter_given=filter_given, **kwargs)
        except NotFoundError:
            with self._lock:
                self._collections.pop(meta.name, None)
            raise

    def _read_record(self, name: CollectionName) -> CollectionRecord:
        """The collection's record as Milvus describes it now (nothing is loaded)."""
        milvus_name = milvus_collection_name(name.stored)
        if not self.gateway.call("has_collection", milvus_name, collection=name.public):
            raise NotFoundError(f"collection {name.public!r} does not exist", field="collection")
        described = self.gateway.call("describe_collection", milvus_name, collection=name.public)
        return dataclasses.replace(_parse_description(name, milvus_name, described), read_at=self._clock())

    def _create(self, name: CollectionName, space: EmbeddingSpace) -> CollectionRecord:
        milvus_name = milvus_collection_name(name.stored)
        description = {
            "format": DESCRIPTION_FORMAT,
            "name": name.stored,
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
            creating = self._creating.setdefault(name.stored, threading.Lock())
        with creating:
            if not self.gateway.call("has_collection", milvus_name, collection=name.public):
                # Strong consistency: a search right after an ingest sees the ingested documents.
                self.gateway.call("create_collection", milvus_name, schema=schema, index_params=index_params,
                                  consistency_level="Strong", collection=name.public)
        return self.lookup(name)  # also when another process created it first: its record wins

    def _info(self, meta: CollectionRecord) -> CollectionInfo:
        rows = self.call(meta, "query", meta.milvus_name, filter="", output_fields=["count(*)"])
        return CollectionInfo(meta.public, meta.space_id, meta.model, meta.dim, int(rows[0]["count(*)"]))


def check_space(meta: CollectionRecord, space: EmbeddingSpace) -> None:
    """``ConflictError`` unless the collection holds vectors of ``space``."""
    if meta.space_id != space.space_id:
        raise ConflictError(
            f"collection {meta.public!r} holds vectors of embedding space {meta.space_id} "
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


def _parse_description(name: CollectionName, milvus_name: str, described: dict) -> CollectionRecord:
    try:
        record = json.loads(described.get("description") or "")
        found = record.get("format")
        if isinstance(found, str) and found.startswith("ragcache.knowledge/") and found not in READABLE_FORMATS:
            raise ConflictError(
                f"collection {name.public!r} was written by another ragcache version ({found}, this one reads "
                f"{DESCRIPTION_FORMAT}): ingest into a new collection, or drop it and ingest again"
            )
        if found not in READABLE_FORMATS:
            raise ValueError(found)
        hashed = any(field.get("name") == "content_hash" for field in described.get("fields", []))
        return CollectionRecord(name.stored, milvus_name, record["space_id"], record["model"], int(record["dim"]),
                                record["uid"], hashed=hashed, keyword=has_keyword_index(described), public=name.public,
                                format=found)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConflictError(f"Milvus collection {milvus_name!r} exists but is not a ragcache knowledge base") from exc
