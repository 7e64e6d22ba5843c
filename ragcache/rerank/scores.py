"""Rerank scores cached like vectors: a score is a 1-d vector in the reranker's space.

``RerankCache`` is an ``EmbeddingCache`` whose "texts" are (query, text) pairs and whose "model" is the
reranker, so a score walks the same levels (L1 slab, L2 Redis), is computed once however many callers miss
it at once, batched across concurrent requests, and counted in the same statistics. The key is
``rc:<score space id>:<BLAKE2b-128 of the pair>``: a repeated query over the same texts reranks for free, in
this process (L1) and in every replica sharing Redis (L2). Milvus (L3) is not used: a score is four bytes,
and recomputing one after Redis forgets it is cheaper than a durable store for it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

import numpy as np
import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.encoder import EncoderStats
from ragcache.core.scope import UNSCOPED, Scope
from ragcache.errors import InvalidInputError
from ragcache.rerank.base import Reranker, RerankHit, RerankResult

__all__ = ["RerankCache", "PairEncoder", "pair_text"]


def pair_text(query: str, text: str, tenant: str | None = None) -> str:
    """One string per pair, the cache's "text": JSON keeps the boundary exact (no separator to collide with).
    A tenant keeping its own cache entries changes the key, not the score."""
    return json.dumps([query, text] if tenant is None else [query, text, tenant], ensure_ascii=False)


class PairEncoder:
    """The reranker behind the cache's ``Encoder`` interface: pair strings in, a ``[n, 1]`` tensor out."""

    def __init__(self, reranker: Reranker):
        self.reranker = reranker
        self.space = reranker.space
        self._lock = threading.Lock()
        self._num_pairs = 0
        self._num_batches = 0
        self._compute_s = 0.0
        self._batch_sizes: list[int] = []

    def encode(self, texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:  # takes no prompt (none declared)
        pairs = [tuple(json.loads(text)[:2]) for text in texts]
        started = time.perf_counter()
        scores = self.reranker.score(pairs)
        elapsed = time.perf_counter() - started
        with self._lock:
            self._num_pairs += len(pairs)
            self._num_batches += 1
            self._compute_s += elapsed
            self._batch_sizes = (self._batch_sizes + [len(pairs)])[-256:]
        return torch.from_numpy(np.asarray(scores, dtype=np.float32).reshape(-1, 1))

    def stats(self) -> EncoderStats:
        with self._lock:
            return EncoderStats(self._num_pairs, self._num_batches, self._compute_s, tuple(self._batch_sizes))


class RerankCache:
    """One reranker and its score levels. ``rerank`` is blocking (levels, the model or the remote API)."""

    def __init__(self, reranker: Reranker, cache: EmbeddingCache):
        self.reranker = reranker
        self.cache = cache
        self.name = reranker.name

    def rerank(self, query: str, texts: Sequence[str], *, top_n: int | None = None, scope: Scope = UNSCOPED) -> RerankResult:
        """The texts' indexes sorted by score, best first (ties keep the request's order), at most ``top_n``.
        The request's ``scope`` keeps a tenant's scores its own (a reranker has no prompts: only its tenant counts)."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidInputError("texts must be a list of strings", field="texts")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise InvalidInputError(f"top_n must be a positive integer, got {top_n!r}", field="top_n")
        if not texts:
            return RerankResult(self.name, (), {})
        embedded = self.cache.embed_detailed([pair_text(query, text, scope.tenant) for text in texts])
        scores = np.asarray(embedded.vectors, dtype=np.float32).reshape(len(texts))
        order = np.argsort(-scores, kind="stable")[:top_n]
        hits = tuple(RerankHit(int(index), float(scores[index])) for index in order)
        return RerankResult(self.name, hits, embedded.served)

    def close(self) -> None:
        self.cache.close()
        self.reranker.close()
