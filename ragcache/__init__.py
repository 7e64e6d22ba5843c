"""ragcache: a multi-level embedding cache (device LRU -> Redis -> Milvus -> model) and RAG retrieval.

    >>> from ragcache import open_cache
    >>> with open_cache() as cache:
    ...     vectors = cache.embed(["What is a KV cache?"])   # numpy [1, 384]

Names are imported on first use, so ``import ragcache.client`` stays light (no torch, no pymilvus) for apps
that only talk to the service over HTTP.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ragcache.errors import (
    AuthenticationError,
    ConfigError,
    ConflictError,
    InvalidInputError,
    InvalidTextError,
    NotFoundError,
    RagCacheError,
    ServiceError,
    ServiceUnavailableError,
    TierUnavailableError,
)

__version__ = "0.1.0"

_LAZY = {
    "EmbeddingCache": "ragcache.core.cache",
    "EmbedResult": "ragcache.core.cache",
    "EmbeddingSpace": "ragcache.core.keys",
    "text_hash": "ragcache.core.keys",
    "Settings": "ragcache.settings",
    "Stores": "ragcache.storage.stores",
    "CacheStats": "ragcache.core.stats",
    "LevelStats": "ragcache.core.stats",
    "build_cache": "ragcache.build",
    "load_encoder": "ragcache.build",
    "open_cache": "ragcache.build",
    "KnowledgeBase": "ragcache.retrieval.knowledge",
    "SearchOptions": "ragcache.retrieval.ranking",
    "Client": "ragcache.client",
    "AsyncClient": "ragcache.client",
}

__all__ = [
    *_LAZY,
    "RagCacheError",
    "InvalidInputError",
    "InvalidTextError",
    "NotFoundError",
    "ConflictError",
    "ConfigError",
    "TierUnavailableError",
    "AuthenticationError",
    "ServiceUnavailableError",
    "ServiceError",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ragcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from ragcache.build import build_cache, load_encoder, open_cache
    from ragcache.client import AsyncClient, Client
    from ragcache.core.cache import EmbeddingCache, EmbedResult
    from ragcache.core.keys import EmbeddingSpace, text_hash
    from ragcache.core.stats import CacheStats, LevelStats
    from ragcache.retrieval.knowledge import KnowledgeBase
    from ragcache.retrieval.ranking import SearchOptions
    from ragcache.settings import Settings
    from ragcache.storage.stores import Stores
