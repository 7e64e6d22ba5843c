"""Fixtures the retrieval tests share."""

from __future__ import annotations

import json
import secrets

import pytest
from pymilvus import DataType, MilvusClient

from ragcache.build import build_cache
from ragcache.core.cache import EmbeddingCache
from ragcache.retrieval.catalog import METRIC
from ragcache.retrieval.documents import milvus_collection_name
from ragcache.retrieval.knowledge import DESCRIPTION_FORMAT
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


def earlier_collection(milvus_client, cache: EmbeddingCache, name: str, *, format: str = DESCRIPTION_FORMAT,  # noqa: A002
                       content_hash: bool = False) -> str:
    """A collection as an earlier ragcache made it, for ``cache``'s space: the description of ``format``, the dense
    vector and no BM25 field, and a ``content_hash`` field only when asked. Returns its Milvus name."""
    description = {"format": format, "name": name, "space_id": cache.space.space_id, "model": cache.space.model,
                   "dim": cache.space.dim, "uid": secrets.token_hex(8)}
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False, description=json.dumps(description))
    schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=32)
    schema.add_field("id", DataType.VARCHAR, max_length=512)
    schema.add_field("text", DataType.VARCHAR, max_length=65535)
    schema.add_field("metadata", DataType.JSON)
    if content_hash:
        schema.add_field("content_hash", DataType.VARCHAR, max_length=32)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=cache.space.dim)
    index_params = MilvusClient.prepare_index_params()
    index_params.add_index(field_name="vector", index_type="AUTOINDEX", metric_type=METRIC)
    milvus_collection = milvus_collection_name(name)
    milvus_client.create_collection(milvus_collection, schema=schema, index_params=index_params, consistency_level="Strong")
    return milvus_collection
