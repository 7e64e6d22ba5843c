"""Fixtures the retrieval tests share."""

from __future__ import annotations

import pytest

from ragcache.build import build_cache
from ragcache.core.cache import EmbeddingCache
from ragcache.settings import Settings
from ragcache.storage.stores import Stores


def l1_only_cache(encoder) -> EmbeddingCache:
    """``encoder``'s cache, L1 only: the knowledge base is what is under test, and each test controls what the
    cache holds."""
    return build_cache(Settings(redis_url="off", milvus_uri="off", write_behind=False), Stores(None, None), encoder)


@pytest.fixture(scope="module")
def cache(encoder):
    """The packaged model's L1-only cache, one per test module."""
    with l1_only_cache(encoder) as embedding_cache:
        yield embedding_cache
