"""ragcache: a multi-level embedding cache (device LRU -> Redis -> Milvus -> model) and RAG retrieval.

    >>> from ragcache import open_cache
    >>> with open_cache() as cache:
    ...     vectors = cache.embed(["What is a KV cache?"])   # numpy [1, 384]
"""

from ragcache.build import build_cache, load_encoder, open_cache
from ragcache.cache import EmbeddingCache, EmbedResult
from ragcache.errors import (
    ConfigError,
    ConflictError,
    InvalidInputError,
    InvalidTextError,
    NotFoundError,
    RagCacheError,
    TierUnavailableError,
)
from ragcache.keys import EmbeddingSpace, text_hash
from ragcache.settings import Settings
from ragcache.stats import CacheStats, LevelStats
from ragcache.stores import Stores

__version__ = "0.1.0"

__all__ = [
    "EmbeddingCache",
    "EmbedResult",
    "EmbeddingSpace",
    "Settings",
    "Stores",
    "CacheStats",
    "LevelStats",
    "build_cache",
    "load_encoder",
    "open_cache",
    "text_hash",
    "RagCacheError",
    "InvalidInputError",
    "InvalidTextError",
    "NotFoundError",
    "ConflictError",
    "ConfigError",
    "TierUnavailableError",
]
