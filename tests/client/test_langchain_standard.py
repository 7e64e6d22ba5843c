"""LangChain's own conformance suite (``langchain-tests``) over the adapters, against a live service (real Redis,
Milvus Lite, the packaged model, over HTTP with an API key). Each standard class runs twice: with a ``Client`` only
(LangChain runs the async methods in a thread) and with a ``Client`` and an ``AsyncClient``. No standard test is
overridden or skipped: the subclasses only give the fixtures the suite asks for.

Every vector-store test gets a collection of its own (a fresh name, dropped afterwards): the suite expects an empty
store per test, and a collection never written is one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langchain_tests.integration_tests import EmbeddingsIntegrationTests, RetrieversIntegrationTests, VectorStoreIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

from ragcache.client import AsyncClient, Client
from ragcache.errors import NotFoundError
from ragcache.integrations.langchain import RagCacheEmbeddings, RagCacheRetriever, RagCacheVectorStore
from tests.client.conftest import KEY
from tests.live_server import LiveServer

RETRIEVER_COLLECTION = "lc_retriever"
RETRIEVER_TEXTS = [
    "A KV cache keeps attention keys and values so a prefix is not computed again.",
    "Milvus is a database for vector similarity search.",
    "An LRU cache evicts the least recently used entry first.",
    "Redis keeps values in memory and expires them after a time to live.",
    "Embeddings map texts to vectors whose distances reflect meaning.",
]


@pytest.fixture(scope="module")
def service(keyed_service) -> LiveServer:
    with Client(keyed_service.url, api_key=KEY, timeout=120) as client:
        client.add_documents(RETRIEVER_COLLECTION, [{"id": f"r{i}", "text": text} for i, text in enumerate(RETRIEVER_TEXTS)])
    return keyed_service


@pytest.fixture
def client(service) -> Iterator[Client]:
    with Client(service.url, api_key=KEY, timeout=120) as made:
        yield made


@pytest.fixture
async def async_client(service) -> AsyncIterator[AsyncClient]:
    # Made in the test's own event loop: an httpx.AsyncClient's connections belong to the loop that opened them.
    async with AsyncClient(service.url, api_key=KEY, timeout=120) as made:
        yield made


def fresh_collection() -> str:
    return f"lc_{uuid.uuid4().hex}"


def drop(client: Client, collection: str) -> None:
    try:
        client.drop_collection(collection)
    except NotFoundError:
        pass  # nothing was written to it


# ---- embeddings -----------------------------------------------------------------------------------------------

class ClientOnlyEmbeddings:
    """The embeddings under test, over a ``Client`` only (the standard classes ask for these two properties)."""

    @pytest.fixture(autouse=True)
    def _given(self, client: Client) -> None:
        self.client = client

    @property
    def embeddings_class(self) -> type[RagCacheEmbeddings]:
        return RagCacheEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"client": self.client}


class BothClientsEmbeddings(ClientOnlyEmbeddings):
    """... over a ``Client`` and an ``AsyncClient`` (the async methods take the async one)."""

    @pytest.fixture(autouse=True)
    def _given(self, client: Client, async_client: AsyncClient) -> None:
        self.client, self.async_client = client, async_client

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"client": self.client, "async_client": self.async_client}


class TestEmbeddingsUnitClientOnly(ClientOnlyEmbeddings, EmbeddingsUnitTests):
    pass


class TestEmbeddingsUnitBothClients(BothClientsEmbeddings, EmbeddingsUnitTests):
    pass


class TestEmbeddingsIntegrationClientOnly(ClientOnlyEmbeddings, EmbeddingsIntegrationTests):
    pass


class TestEmbeddingsIntegrationBothClients(BothClientsEmbeddings, EmbeddingsIntegrationTests):
    pass


# ---- vector store ---------------------------------------------------------------------------------------------

class TestVectorStoreClientOnly(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self, client: Client) -> Iterator[RagCacheVectorStore]:  # type: ignore[override]
        collection = fresh_collection()
        try:
            yield RagCacheVectorStore(client, collection)
        finally:
            drop(client, collection)


class TestVectorStoreBothClients(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self, client: Client, async_client: AsyncClient) -> Iterator[RagCacheVectorStore]:  # type: ignore[override]
        collection = fresh_collection()
        try:
            yield RagCacheVectorStore(client, collection, async_client=async_client)
        finally:
            drop(client, collection)


# ---- retriever ------------------------------------------------------------------------------------------------

class TestRetrieverClientOnly(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def _given(self, client: Client) -> None:
        self.client_params: dict[str, Any] = {"client": client}

    @property
    def retriever_constructor(self) -> type[RagCacheRetriever]:
        return RagCacheRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {**self.client_params, "collection": RETRIEVER_COLLECTION}

    @property
    def retriever_query_example(self) -> str:
        return "which entry does an LRU cache evict?"

    @property
    def num_results_arg_name(self) -> str:
        return "top_k"  # the retriever's field; invoke(..., k=) is taken too


class TestRetrieverBothClients(TestRetrieverClientOnly):
    @pytest.fixture(autouse=True)
    def _given(self, client: Client, async_client: AsyncClient) -> None:
        self.client_params = {"client": client, "async_client": async_client}
