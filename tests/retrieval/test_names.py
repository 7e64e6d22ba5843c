"""A tenant's collection names (ragcache.retrieval.names): resolved in one place, and the knowledge base's errors
name the collection as the caller does, never by its stored name (real Milvus Lite; a fake model through the
constructor, since only names are under test)."""

from __future__ import annotations

import uuid

import pytest
import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.errors import ConflictError, InvalidInputError, NotFoundError
from ragcache.retrieval.knowledge import KnowledgeBase
from ragcache.retrieval.names import CollectionName, public_name, tenant_prefix
from ragcache.tiers import MemoryTier
from tests.fakes import HashEncoder

DOCS = [{"id": "1", "text": "Acme's roadmap: rockets"}, {"id": "2", "text": "Acme's numbers"}]


def cache_of_dim(dim: int) -> EmbeddingCache:
    return EmbeddingCache(HashEncoder(dim), Levels([MemoryTier(1 << 16, dim, torch.float32)], dim=dim, dtype=torch.float32,
                                                 write_behind=False))


def test_a_tenants_name_is_stored_under_its_prefix_and_read_back_without_it():
    name = CollectionName.of("docs", "acme")
    assert (name.stored, name.public) == ("acme--docs", "docs")
    assert CollectionName.of("docs") == CollectionName("docs", "docs")  # the operator's view: one name
    assert CollectionName.of(name, "globex") is name  # already resolved
    assert tenant_prefix("acme") == "acme--" and tenant_prefix(None) == ""
    assert public_name("acme", "acme--docs") == "docs" and public_name("globex", "acme--docs") is None
    assert public_name(None, "acme--docs") == "acme--docs"
    with pytest.raises(InvalidInputError, match="at most 57 characters") as caught:
        CollectionName.of("d" * 60, "acme")
    assert caught.value.field == "collection"
    with pytest.raises(InvalidInputError) as invalid:
        CollectionName.of("-docs", "acme")
    assert invalid.value.field == "collection" and "acme" not in str(invalid.value)


def test_the_knowledge_bases_errors_name_the_collection_as_the_tenant_does(milvus_client):
    public = "docs_" + uuid.uuid4().hex[:6]
    acme, globex = CollectionName.of(public, "acme"), CollectionName.of(public, "globex")
    kb = KnowledgeBase(milvus_client)
    with cache_of_dim(8) as cache, cache_of_dim(16) as other:
        result = kb.add_documents(acme, DOCS, cache=cache)
        assert result.collection == public and result.num_inserted == 2
        assert [hit.id for hit in kb.search(acme, "rockets", cache=cache, top_k=2).hits]
        errors = []
        for call in (lambda: kb.search(globex, "rockets", cache=cache), lambda: kb.list_ids(globex),
                     lambda: kb.drop_collection(globex), lambda: kb.add_documents(acme, DOCS, cache=other),
                     lambda: kb.search(acme, "rockets", cache=other)):
            with pytest.raises((NotFoundError, ConflictError)) as caught:
                call()
            errors.append(caught.value)
        # The stored name of the same collection, asked for by the operator, is named as the operator sent it.
        with pytest.raises(ConflictError, match=f"'acme--{public}'"):
            kb.add_documents(f"acme--{public}", DOCS, cache=other)
        kb.drop_collection(acme)
    assert [type(error) for error in errors] == [NotFoundError] * 3 + [ConflictError] * 2
    for error in errors:
        assert repr(public) in str(error) and "acme--" not in str(error) and "globex--" not in str(error), error
