"""Fixtures the retrieval tests share."""

from __future__ import annotations

import pytest

from ragcache.build import build_cache
from ragcache.settings import Settings
from ragcache.storage.stores import Stores


@pytest.fixture(scope="module")
def cache(encoder):
    """The packaged model's cache, L1 only, one per test module: the knowledge base is what is under test, and each
    test controls what the cache holds."""
    settings = Settings(redis_url="off", milvus_uri="off", write_behind=False)
    with build_cache(settings, Stores(None, None), encoder) as embedding_cache:
        yield embedding_cache
