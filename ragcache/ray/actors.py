"""The callables Ray Data runs in its actors: each opens its own embedding cache once and keeps it.

Every actor has its own L1 and shares the rest with every other actor and every service replica: L2 in the
Redis (or Redis Cluster) of ``settings.levels.redis_url``, L3 and the knowledge base in the Milvus server of
``settings.levels.milvus_uri``, and the single-flight locks in that same Redis, so a text several actors miss at
once is computed by one of them (``ragcache.core.flight``). The cache is the one ``open_cache`` builds from the
same settings, so a vector here is bit for bit the one ``/embed`` serves for the same text and space.

Nothing here imports Ray: the classes are plain callables, which Ray pickles to the actors.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ragcache.core.cache import EmbeddingCache, EmbedResult
from ragcache.core.encoder import capabilities_of
from ragcache.deployment import Deployment
from ragcache.errors import ConfigError
from ragcache.retrieval.documents import Document
from ragcache.settings import Settings
from ragcache.storage.stores import Stores

__all__ = ["CachedEmbedder", "DocumentWriter", "open_model_cache", "served_once", "LEVEL_COLUMN", "TOKENS_COLUMN"]

LEVEL_COLUMN = "embedding_level"  # per row: the level that served its vector (L1, L2, L3 or compute)
TOKENS_COLUMN = "embedding_tokens"  # per row, remote models only: the text's tokens (what a hit did not send)


def open_model_cache(settings: Settings, model: str | None = None) -> tuple[EmbeddingCache, Stores]:
    """The cache of ``model`` (default ``settings.space.model``; a local model, or a remote one the settings
    configure) and the stores it uses, which close with it. Checked for drift before its first lookup."""
    deployment = _open_shared(settings, model)
    cache = deployment.caches[model or settings.space.model]
    cache.release_on_close(deployment.close)
    return cache, deployment.stores


def _open_shared(settings: Settings, model: str | None, *, knowledge: bool = False) -> Deployment:
    """A deployment of the one model ``model`` over stores that every actor shares (refused otherwise)."""
    levels = settings.levels
    if levels.redis_url is None or levels.resolved_milvus_uri is not None and levels.resolved_milvus_uri.endswith(".db"):
        raise ConfigError(
            "a Ray pipeline shares its stores across actors: set redis_url to a Redis server (or 'off') and milvus_uri "
            "to a Milvus server (or 'off'); an embedded Redis and a Milvus Lite file belong to one process"
        )
    return Deployment.open(settings, models=[model or settings.space.model], knowledge=knowledge)


def served_once(result: EmbedResult, keys: list[str]) -> np.ndarray:
    """Per input, the level that served it, a text computed once counting once: its repeats later in the
    same batch are served from that one computation, held in L1 (``EmbedResult`` marks them computed too)."""
    levels = result.levels.copy()
    computed = len(result.level_names) - 1
    seen: set[str] = set()
    for index in np.flatnonzero(levels == computed).tolist():
        if keys[index] in seen:
            levels[index] = 0
        seen.add(keys[index])
    return levels


class CachedEmbedder:
    """For ``Dataset.map_batches``: adds ``output_column`` (one vector per row of ``text_column``) and the
    level that served each row (``LEVEL_COLUMN``; remote models also the text's tokens, ``TOKENS_COLUMN``)."""

    def __init__(self, settings: Settings, text_column: str, *, model: str | None = None, output_column: str = "embedding"):
        self.text_column = text_column
        self.output_column = output_column
        self.cache, self._stores = open_model_cache(settings, model)
        self._remote = capabilities_of(self.cache.encoder).remote  # a local model has no upstream to save tokens of

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(text) for text in batch[self.text_column]]
        result = self.cache.embed_detailed(texts)
        space = self.cache.space
        levels = served_once(result, space.keys(space.prepare(texts)))
        batch[self.output_column] = np.asarray(result.vectors)
        batch[LEVEL_COLUMN] = np.array(result.level_names, dtype=object)[levels]
        if self._remote:
            batch[TOKENS_COLUMN] = np.array(self.cache.tokenizer.count_tokens(texts), dtype=np.int64)
        # Before the batch counts as done: Ray ends the actors with the pipeline, without a close, and a vector
        # still queued for L3 would be lost (to be computed again by the next run).
        self.cache.flush()
        return batch

    def __del__(self) -> None:
        cache = getattr(self, "cache", None)
        if cache is not None:
            cache.close()  # flushes the writes still queued for L2/L3


class DocumentWriter:
    """For ``Dataset.map_batches``: upserts each batch of documents (columns ``id``, ``text``, ``metadata``)
    into ``collection`` through the cache, as ``KnowledgeBase.add_documents`` does for the service: a
    document stored with the same content hash is left alone, nothing embedded, nothing written.

    Returns one row per batch: its counts, the levels that served its embeddings (a text computed once
    counting once) and the ids it holds (for a sync's cleanup). Upserts by id are idempotent, so a batch
    retried after its actor died writes each document once more at most, and never a second copy.

    ``after_batch``: called after a batch is written, before its row is returned (the fault tests' seam).
    """

    def __init__(self, settings: Settings, collection: str, *, model: str | None = None,
                 after_batch: Callable[[], None] | None = None):
        self.collection = collection
        deployment = _open_shared(settings, model, knowledge=True)
        if deployment.knowledge is None:
            deployment.close()
            raise ConfigError("ingest needs Milvus: set milvus_uri to a Milvus server")
        self.cache = deployment.caches[model or settings.space.model]
        self.cache.release_on_close(deployment.close)
        self.knowledge = deployment.knowledge
        self.after_batch = after_batch

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        documents = documents_of(batch)
        computed_before = self.cache.stats().texts_computed
        result = self.knowledge.add_documents(self.collection, documents, cache=self.cache)
        # The cache counts each distinct text it computed once; ``served`` counts a repeat in the batch again.
        num_computed = self.cache.stats().texts_computed - computed_before
        served = dict(result.served)
        if served:
            repeats = served[self.cache.level_names[-1]] - num_computed
            served[self.cache.level_names[-1]] = num_computed
            served[self.cache.level_names[0]] = served.get(self.cache.level_names[0], 0) + repeats
        self.cache.flush()  # as CachedEmbedder does: a batch that returned has its vectors in L2 and L3
        if self.after_batch is not None:
            self.after_batch()
        return {
            "num_received": np.array([result.num_received]),
            "num_unchanged": np.array([result.num_unchanged]),
            "num_added": np.array([result.num_inserted]),
            "num_replaced": np.array([result.num_replaced]),
            "num_computed": np.array([num_computed]),
            "served": np.array([json.dumps(served)], dtype=object),
            "ids": np.array([json.dumps([document.id for document in documents])], dtype=object),
        }

    def __del__(self) -> None:
        cache = getattr(self, "cache", None)
        if cache is not None:
            cache.close()


def documents_of(batch: Mapping[str, Any]) -> list[Document]:
    """The batch's documents: ``id`` and ``text`` columns, and ``metadata`` (a JSON object, or its text) when present."""
    metadata = batch.get("metadata")
    documents = []
    for index, (doc_id, text) in enumerate(zip(batch["id"], batch["text"])):
        value = {} if metadata is None else metadata[index]
        if isinstance(value, (str, bytes)):
            value = json.loads(value) if value else {}
        documents.append(Document(str(doc_id), str(text), dict(value or {})))
    return documents
