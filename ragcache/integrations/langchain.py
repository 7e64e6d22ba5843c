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
A returned ``Document`` carries the hit's id and its metadata exactly as stored; the score (cosine similarity)
comes only from the ``*_with_score`` methods, beside the document. A collection nothing was written to yet is an
empty store: its searches return ``[]`` and deleting from it does nothing (the service's 404 names the
``collection``; a model it does not serve still raises ``NotFoundError``).

Queries are embedded with the model's ``query`` prompt and documents with its ``document`` prompt, as ``/search``
and ``/documents`` embed them (a model without prompts embeds the text as is).

``langchain-core`` is an optional dependency (``pip install 'ragcache[langchain]'``); importing this module
without it raises an ``ImportError`` that says so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ragcache.errors import ConfigError, NotFoundError
from ragcache.retrieval.documents import Document as StoredDocument
from ragcache.retrieval.results import SearchResult

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables.config import run_in_executor
    from langchain_core.vectorstores import VectorStore
    from pydantic import ConfigDict
except ImportError as exc:  # pragma: no cover - exercised only where langchain-core is absent
    raise ImportError(
        "ragcache.integrations.langchain needs langchain-core: pip install 'ragcache[langchain]' (or langchain-core)"
    ) from exc

if TYPE_CHECKING:
    from ragcache.client import AsyncClient, Client

__all__ = ["RagCacheEmbeddings", "RagCacheRetriever", "RagCacheVectorStore"]

# The service's input types: a query and a document of one model are embedded with different prompts.
QUERY, DOCUMENT = "query", "document"


class RagCacheEmbeddings(Embeddings):
    """Embeddings from a ragcache service: ``embed_query`` in the service's query space (the model's ``query``
    prompt, as ``/search`` embeds), ``embed_documents`` in its document space (as ``/documents`` stores).

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
        return self._sync_client().embed(texts, input_type=DOCUMENT).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self._sync_client().embed([text], input_type=QUERY)[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        if self.async_client is None:
            return await super().aembed_documents(texts)
        if not texts:
            return []
        return (await self.async_client.embed(texts, input_type=DOCUMENT)).tolist()  # type: ignore[misc]

    async def aembed_query(self, text: str) -> list[float]:
        if self.async_client is None:
            return await super().aembed_query(text)
        return (await self.async_client.embed([text], input_type=QUERY))[0].tolist()  # type: ignore[misc]

    def _sync_client(self) -> Client:
        if self.client is None:
            raise ConfigError("this RagCacheEmbeddings has only an AsyncClient: use aembed_* or pass client=")
        return self.client


def _documents(result: SearchResult | None) -> list[Document]:
    """LangChain documents from a search answer (None: an empty collection), best first, each with its id and
    its metadata as stored: a score would be a key the user never stored, or overwrite one they did."""
    return [document for document, _ in _scored(result)]


def _scored(result: SearchResult | None) -> list[tuple[Document, float]]:
    hits = () if result is None else result.hits
    return [(Document(page_content=hit.text, metadata=dict(hit.metadata), id=hit.id), hit.score) for hit in hits]


def _from_stored(documents: Sequence[StoredDocument]) -> list[Document]:
    return [Document(page_content=document.text, metadata=dict(document.metadata), id=document.id) for document in documents]


@contextmanager
def _empty_if_unwritten() -> Iterator[None]:
    """Lets a collection nothing was written to yet read as empty: its 404 names the ``collection`` field (the
    caller then returns its empty answer); any other 404 (a model the service does not serve) is raised."""
    try:
        yield
    except NotFoundError as exc:
        if exc.field != "collection":
            raise


def _num_results(default: int, k: int | None, top_k: int | None) -> int:
    """The per-call number of results (``k``, LangChain's name, or ``top_k``), else the retriever's own."""
    if k is not None and top_k is not None and k != top_k:
        raise ConfigError(f"k={k} and top_k={top_k} disagree: give one of them")
    return k if k is not None else top_k if top_k is not None else default


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

    # ``k``/``top_k`` in the signature: LangChain hands ``invoke``'s keyword arguments only to a method that takes them.
    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None,
                                top_k: int | None = None) -> list[Document]:
        if self.client is None:
            raise ConfigError("this RagCacheRetriever has only an AsyncClient: use ainvoke, or pass client=")
        result = None
        with _empty_if_unwritten():
            result = self.client.search(query, self.collection, top_k=_num_results(self.top_k, k, top_k), filter=self.filter,
                                        options=self.options)
        return _documents(result)

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, top_k: int | None = None) -> list[Document]:
        if self.async_client is None:
            # LangChain's default runs the blocking method in a thread, but without the per-call k.
            return await run_in_executor(None, self._get_relevant_documents, query, run_manager=run_manager.get_sync(),
                                         k=k, top_k=top_k)
        result = None
        with _empty_if_unwritten():
            result = await self.async_client.search(query, self.collection, top_k=_num_results(self.top_k, k, top_k),
                                                    filter=self.filter, options=self.options)
        return _documents(result)


class RagCacheVectorStore(VectorStore):
    """One collection of the service as a LangChain ``VectorStore``: texts are embedded by the service
    (through its cache) and stored in its Milvus; ``similarity_search`` is ``/search``, ``get_by_ids`` is
    ``/documents/get``.

    Ids are the service's document ids: a text or document without one gets a random one. ``filter`` is a
    Milvus expression string, as the service takes it. Scores are cosine similarities (higher is nearer).
    The collection is created by the first write; until then the store is empty.
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
        if rows:
            self._sync_client().add_documents(self.collection, rows)
        return [row["id"] for row in rows]

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                         ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        if self.async_client is None:
            return await super().aadd_texts(texts, metadatas, ids=ids, **kwargs)
        rows = _rows(list(texts), metadatas, ids)
        if rows:
            await self.async_client.add_documents(self.collection, rows)  # type: ignore[misc]
        return [row["id"] for row in rows]

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in the order asked; ids the collection does not hold are left out."""
        if not ids:
            return []
        found: Sequence[StoredDocument] = []
        with _empty_if_unwritten():
            found = self._sync_client().get_documents(self.collection, ids)
        return _from_stored(found)

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        if self.async_client is None:
            return await super().aget_by_ids(ids)
        if not ids:
            return []
        found: Sequence[StoredDocument] = []
        with _empty_if_unwritten():
            found = await self.async_client.get_documents(self.collection, ids)  # type: ignore[misc]
        return _from_stored(found)

    def similarity_search(self, query: str, k: int = 4, filter: str | None = None, **kwargs: Any) -> list[Document]:  # noqa: A002
        return [document for document, _ in self.similarity_search_with_score(query, k, filter=filter)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: str | None = None,  # noqa: A002
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        result = None
        with _empty_if_unwritten():
            result = self._sync_client().search(query, self.collection, top_k=k, filter=filter)
        return _scored(result)

    async def asimilarity_search(self, query: str, k: int = 4, filter: str | None = None,  # noqa: A002
                                 **kwargs: Any) -> list[Document]:
        return [document for document, _ in await self.asimilarity_search_with_score(query, k, filter=filter)]

    async def asimilarity_search_with_score(self, query: str, k: int = 4, filter: str | None = None,  # noqa: A002
                                            **kwargs: Any) -> list[tuple[Document, float]]:
        if self.async_client is None:
            return await super().asimilarity_search_with_score(query, k, filter=filter, **kwargs)
        result = None
        with _empty_if_unwritten():
            result = await self.async_client.search(query, self.collection, top_k=k, filter=filter)  # type: ignore[misc]
        return _scored(result)

    def _similarity_search_with_relevance_scores(self, query: str, k: int = 4, **kwargs: Any) -> list[tuple[Document, float]]:
        # Cosine similarity in [-1, 1] -> LangChain's relevance in [0, 1].
        return [(document, (score + 1) / 2) for document, score in self.similarity_search_with_score(query, k, **kwargs)]

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete these ids; ids not stored, and a collection not yet written, are nothing to delete."""
        if not ids:
            raise ConfigError("RagCacheVectorStore.delete needs the ids to delete (the service has no delete-all)")
        with _empty_if_unwritten():
            self._sync_client().delete_documents(self.collection, ids)
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        if self.async_client is None:
            return await super().adelete(ids, **kwargs)
        if not ids:
            raise ConfigError("RagCacheVectorStore.adelete needs the ids to delete (the service has no delete-all)")
        with _empty_if_unwritten():
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


def _rows(texts: Sequence[str], metadatas: list[dict] | None, ids: Sequence[str | None] | None) -> list[dict[str, Any]]:
    """The service's documents for ``texts``; a text without an id (LangChain passes ``None`` for a document that
    has none beside others that do) gets a random one, as the service takes no null id."""
    if metadatas is not None and len(metadatas) != len(texts):
        raise ConfigError(f"{len(metadatas)} metadatas for {len(texts)} texts")
    if ids is not None and len(ids) != len(texts):
        raise ConfigError(f"{len(ids)} ids for {len(texts)} texts")
    given = ids if ids is not None else [None] * len(texts)
    return [{"id": id_ or uuid.uuid4().hex, "text": text, "metadata": (metadatas[i] if metadatas else {}) or {}}
            for i, (id_, text) in enumerate(zip(given, texts))]
