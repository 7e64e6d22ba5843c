"""ragcache: a multi-level embedding cache (device LRU -> Redis -> Milvus -> model) and RAG retrieval.

    >>> from ragcache import open_cache
    >>> with open_cache() as cache:
    ...     vectors = cache.embed(["What is a KV cache?"])   # numpy [1, 384]

Names are imported on first use, so ``import ragcache.client`` stays light (no torch, no pymilvus) for apps
that only talk to the service over HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache import errors
from ragcache.errors import (
    AuthenticationError,
    ComputeError,
    ConfigError,
    ConflictError,
    DataFolderInUseError,
    InvalidInputError,
    InvalidTextError,
    ModelOutOfMemoryError,
    NotFoundError,
    OverloadedError,
    PartialEncodeError,
    QuotaExceededError,
    RagCacheError,
    ServiceError,
    ServiceUnavailableError,
    TierUnavailableError,
    UpstreamBadResponseError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from ragcache.observe.exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    ".core.cache": ("EmbeddingCache", "EmbedResult"),
    ".core.keys": ("EmbeddingSpace", "text_hash"),
    ".settings": ("Settings",),
    ".storage.stores": ("Stores",),
    ".core.stats": ("CacheStats", "LevelStats"),
    ".build": ("build_cache", "drift_monitor", "load_encoder"),
    ".deployment": ("Deployment", "open_cache", "remote_models", "served_models"),
    ".retrieval.knowledge": ("KnowledgeBase",),
    ".retrieval.ranking": ("SearchOptions",),
    ".client": ("Client", "AsyncClient"),
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ += errors.__all__  # the whole error tree, imported above

if TYPE_CHECKING:
    from ragcache.build import build_cache, drift_monitor, load_encoder
    from ragcache.client import AsyncClient, Client
    from ragcache.core.cache import EmbeddingCache, EmbedResult
    from ragcache.core.keys import EmbeddingSpace, text_hash
    from ragcache.core.stats import CacheStats, LevelStats
    from ragcache.deployment import Deployment, open_cache, remote_models, served_models
    from ragcache.retrieval.knowledge import KnowledgeBase
    from ragcache.retrieval.ranking import SearchOptions
    from ragcache.settings import Settings
    from ragcache.storage.stores import Stores
