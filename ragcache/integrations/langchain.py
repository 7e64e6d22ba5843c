"""LangChain over the ragcache service: ``Embeddings`` (embed through the cache), a ``BaseRetriever`` and a
``VectorStore`` over ``/search`` and ``/documents``, so a LangChain RAG pipeline embeds and retrieves through it.

    >>> from ragcache.client import Client
    >>> from ragcache.integrations.langchain import RagCacheEmbeddings, RagCacheRetriever, RagCacheVectorStore
    >>> client = Client("http://127.0.0.1:8000", api_key="...")
    >>> vector = RagCacheEmbeddings(client).embed_query("What is a KV cache?")
    >>> documents = RagCacheRetriever(client=client, collection="notes", top_k=3).invoke("What is a KV cache?")
    >>> store = RagCacheVectorStore(client, "notes")
    >>> store.add_texts(["An LRU evicts the least recently used entry first."], ids=["lru"])

Everything goes through ``ragcache.client`` (``Client`` for the blocking methods, ``AsyncClient`` for the
``a*`` ones; with only a ``Client`` LangChain runs it in a worker thread), so API keys, retries and errors are
the client's: a failure raises the library's own errors (``AuthenticationError``, ``NotFoundError``, ...).
A returned ``Document`` carries the hit's id, its metadata, and ``score`` (cosine similarity) in metadata.

``langchain-core`` is an optional dependency (``pip install 'ragcache[langchain]'``); importing this module
without it raises an ``ImportError`` that says so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ragcache.errors import ConfigError
from ragcache.retrieval.results import SearchResult

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.vectorstores import VectorStore
    from pydantic import ConfigDict
except ImportError as exc:  # pragma: no cover - exercised only where langchain-core is absent
    raise ImportError(
        "ragcache.integrations.langchain needs langchain-core: pip install 'ragcache[langchain]' (or langchain-core)"
    ) from exc

if TYPE_CHECKING:
    from ragcache.client import AsyncClient, Client

__all__ = ["RagCacheEmbeddings", "RagCacheRetriever", "RagCacheVectorStore"]


class RagCacheEmbeddings(Embeddings):
    """Embeddings from a ragcache service.

    Give a ``Client`` for the blocking methods, an ``AsyncClient`` for the ``a*`` methods, or both. With
    only a ``Client``, the ``a*`` methods run it in a worker thread (LangChain's default behaviour).
    """

    def __init__(self, client: Client | None = None, *, async_client: AsyncClient | None = None):
        if client is None and async_client is None:
            raise ConfigError("RagCacheEmbeddings needs a Client, an AsyncClient, or both")
        self.client = client
        self.async_client = async_client

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return self._sync_client().embed(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self._sync_client().embed([text])[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        if self.async_client is None:
            return await super().aembed_documents(texts)
        if not texts:
            return []
        return (await self.async_client.embed(texts)).tolist()  # type: ignore[misc]

    async def aembed_query(self, text: str) -> list[float]:
        if self.async_client is None:
            return await super().aembed_query(text)
        return (await self.async_client.embed([text]))[0].tolist()  # type: ignore[misc]

    def _sync_client(self) -> Client:
        if self.client is None:
            raise ConfigError("this RagCacheEmbeddings has only an AsyncClient: use aembed_* or pass client=")
        return self.client


def _documents(result: SearchResult) -> list[Document]:
    """LangChain documents from a search answer, best first; the score and the id go with each."""
    return [Document(page_content=hit.text, metadata={**hit.metadata, "score": hit.score}, id=hit.id) for hit in result.hits]


def _scored(result: SearchResult) -> list[tuple[Document, float]]:
    return [(document, hit.score) for document, hit in zip(_documents(result), result.hits)]


class RagCacheRetriever(BaseRetriever):
    """The ``top_k`` documents of ``collection`` nearest to the query, from the service's ``/search``
    (``filter``: a Milvus expression on the documents, e.g. ``metadata["lang"] == "en"``; ``options``: the
    search mode and ranking, e.g. ``SearchOptions(mode="hybrid")``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any = None  # ragcache.client.Client
    async_client: Any = None  # ragcache.client.AsyncClient
    collection: str
    top_k: int = 4
    filter: str | None = None
    options: Any = None  # ragcache.retrieval.ranking.SearchOptions

    def model_post_init(self, context: Any) -> None:
        if self.client is None and self.async_client is None:
            raise ConfigError("RagCacheRetriever needs client= (a Client), async_client= (an AsyncClient), or both")

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        if self.client is None:
            raise ConfigError("this RagCacheRetriever has only an AsyncClient: use ainvoke, or pass client=")
        return _documents(self.client.search(query, self.collection, top_k=self.top_k, filter=self.filter, options=self.options))

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        result = await self.async_client.search(query, self.collection, top_k=self.top_k, filter=self.filter, options=self.options)
        return _documents(result)


class RagCacheVectorStore(VectorStore):
    """One collection of the service as a LangChain ``VectorStore``: texts are embedded by the service
    (through its cache) and stored in its Milvus; ``similarity_search`` is ``/search``.

    Ids are the service's document ids: ``add_texts`` without ``ids`` makes random ones. ``filter`` is a
    Milvus expression string, as the service takes it. Scores are cosine similarities (higher is nearer).
    """

    def __init__(self, client: Client | None, collection: str, *, async_client: AsyncClient | None = None):
        if client is None and async_client is None:
            raise ConfigError("RagCacheVectorStore needs a Client, an AsyncClient, or both")
        self.client = client
        self.async_client = async_client
        self.collection = collection

    @property
    def embeddings(self) -> Embeddings:
        return RagCacheEmbeddings(self.client, async_client=self.async_client)

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *, ids: list[str] | None = None,
                  **kwargs: Any) -> list[str]:
        rows = _rows(list(texts), metadatas, ids)
        self._sync_client().add_documents(self.collection, rows)
        return [row["id"] for row in rows]

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                         ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        if self.async_client is None:
            return await super().aadd_texts(texts, metadatas, ids=ids, **kwargs)
        rows = _rows(list(texts), metadatas, ids)
        await self.async_client.add_documents(self.collection, rows)  # type: ignore[misc]
        return [row["id"] for row in rows]

    def similarity_search(self, query: str, k: int = 4, filter: str | None = None, **kwargs: Any) -> list[Document]:  # noqa: A002
        return [document for document, _ in self.similarity_search_with_score(query, k, filter=filter)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: str | None = None,  # noqa: A002
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        return _scored(self._sync_client().search(query, self.collection, top_k=k, filter=filter))

    async def asimilarity_search(self, query: str, k: int = 4, filter: str | None = None,  # noqa: A002
                                 **kwargs: Any) -> list[Document]:
        return [document for document, _ in await self.asimilarity_search_with_score(query, k, filter=filter)]

    async def asimilarity_search_with_score(self, query: str, k: int = 4, filter: str | None = None,  # noqa: A002
                                            **kwargs: Any) -> list[tuple[Document, float]]:
        if self.async_client is None:
            return await super().asimilarity_search_with_score(query, k, filter=filter, **kwargs)
        return _scored(await self.async_client.search(query, self.collection, top_k=k, filter=filter))  # type: ignore[misc]

    def _similarity_search_with_relevance_scores(self, query: str, k: int = 4, **kwargs: Any) -> list[tuple[Document, float]]:
        # Cosine similarity in [-1, 1] -> LangChain's relevance in [0, 1].
        return [(document, (score + 1) / 2) for document, score in self.similarity_search_with_score(query, k, **kwargs)]

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        if not ids:
            raise ConfigError("RagCacheVectorStore.delete needs the ids to delete (the service has no delete-all)")
        self._sync_client().delete_documents(self.collection, ids)
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        if self.async_client is None:
            return await super().adelete(ids, **kwargs)
        if not ids:
            raise ConfigError("RagCacheVectorStore.adelete needs the ids to delete (the service has no delete-all)")
        await self.async_client.delete_documents(self.collection, ids)  # type: ignore[misc]
        return True

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, client: Client | None = None, collection: str = "",
                   **kwargs: Any) -> RagCacheVectorStore:
        """A store over ``collection`` holding ``texts``. ``embedding`` is ignored: the service embeds."""
        if not collection:
            raise ConfigError("RagCacheVectorStore.from_texts needs collection= (and client=)")
        store = cls(client, collection)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    def _sync_client(self) -> Client:
        if self.client is None:
            raise ConfigError("this RagCacheVectorStore has only an AsyncClient: use the a* methods, or pass client=")
        return self.client


def _rows(texts: Sequence[str], metadatas: list[dict] | None, ids: list[str] | None) -> list[dict[str, Any]]:
    if metadatas is not None and len(metadatas) != len(texts):
        raise ConfigError(f"{len(metadatas)} metadatas for {len(texts)} texts")
    if ids is not None and len(ids) != len(texts):
        raise ConfigError(f"{len(ids)} ids for {len(texts)} texts")
    ids = ids if ids is not None else [uuid.uuid4().hex for _ in texts]
    return [{"id": id_, "text": text, "metadata": (metadatas[i] if metadatas else {}) or {}}
            for i, (id_, text) in enumerate(zip(ids, texts))]
