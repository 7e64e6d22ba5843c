"""LlamaIndex over the ragcache service: a ``BaseEmbedding`` (embed through the cache), a ``BaseRetriever``
over ``/search``, and a vector store over a collection (``RagCacheVectorStore``, from ``llamaindex_store``), so a
LlamaIndex RAG pipeline embeds, stores and retrieves through it.

    >>> from ragcache.client import Client
    >>> from ragcache.integrations.llamaindex import RagCacheEmbedding, RagCacheRetriever, RagCacheVectorStore
    >>> client = Client("http://127.0.0.1:8000", api_key="...")
    >>> embed_model = RagCacheEmbedding(client=client)          # e.g. VectorStoreIndex(nodes, embed_model=...)
    >>> nodes = RagCacheRetriever(client, "notes", top_k=3).retrieve("What is a KV cache?")

Queries are embedded with the model's ``query`` prompt and texts (documents) with its ``document`` prompt, as
``/search`` and ``/documents`` embed them (a model without prompts embeds the text as is).

Everything goes through ``ragcache.client`` (``Client`` for the blocking methods, ``AsyncClient`` for the
async ones; with only a ``Client`` the async methods run it in a worker thread), so API keys, retries and
errors are the client's: a failure raises the library's own errors (``AuthenticationError``, ...).
``llama-index-core`` is an optional dependency (``pip install 'ragcache[llamaindex]'``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ragcache.errors import ConfigError
from ragcache.integrations.llamaindex_store import RagCacheVectorStore
from ragcache.retrieval.ranking import SearchOptions
from ragcache.retrieval.results import SearchResult

try:
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from pydantic import PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only where llama-index-core is absent
    raise ImportError(
        "ragcache.integrations.llamaindex needs llama-index-core: pip install 'ragcache[llamaindex]' (or llama-index-core)"
    ) from exc

if TYPE_CHECKING:
    from ragcache.client import AsyncClient, Client

__all__ = ["RagCacheEmbedding", "RagCacheRetriever", "RagCacheVectorStore"]

# The service's input types: a query and a document of one model are embedded with different prompts.
QUERY, DOCUMENT = "query", "document"


class RagCacheEmbedding(BaseEmbedding):
    """Embeddings from a ragcache service. ``model_name`` is only a label for LlamaIndex; the model is the
    client's (``Client(model=...)``, else the service's default)."""

    _client: Any = PrivateAttr(default=None)
    _async_client: Any = PrivateAttr(default=None)

    def __init__(self, client: Client | None = None, *, async_client: AsyncClient | None = None,
                 model_name: str = "ragcache", **kwargs: Any):
        if client is None and async_client is None:
            raise ConfigError("RagCacheEmbedding needs client= (a Client), async_client= (an AsyncClient), or both")
        super().__init__(model_name=model_name, **kwargs)
        self._client = client
        self._async_client = async_client

    @classmethod
    def class_name(cls) -> str:
        return "RagCacheEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query], QUERY)[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text], DOCUMENT)[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts, DOCUMENT)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._aembed([query], QUERY))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._aembed([text], DOCUMENT))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await self._aembed(texts, DOCUMENT)

    def _embed(self, texts: list[str], input_type: str) -> list[list[float]]:
        if not texts:
            return []
        if self._client is None:
            raise ConfigError("this RagCacheEmbedding has only an AsyncClient: use the a* methods, or pass client=")
        return self._client.embed(texts, input_type=input_type).tolist()

    async def _aembed(self, texts: list[str], input_type: str) -> list[list[float]]:
        if not texts:
            return []
        if self._async_client is None:
            return await asyncio.to_thread(self._embed, texts, input_type)
        return (await self._async_client.embed(texts, input_type=input_type)).tolist()


def _nodes(result: SearchResult) -> list[NodeWithScore]:
    """LlamaIndex nodes from a search answer, best first: id, text and metadata of each hit, and its score
    (cosine similarity, higher is nearer)."""
    return [NodeWithScore(node=TextNode(id_=hit.id, text=hit.text, metadata=dict(hit.metadata)), score=hit.score)
            for hit in result.hits]


class RagCacheRetriever(BaseRetriever):
    """The ``top_k`` documents of ``collection`` nearest to the query, from the service's ``/search``
    (``filter``: a Milvus expression on the documents, e.g. ``metadata["lang"] == "en"``; ``options``: the
    search mode and ranking, e.g. ``SearchOptions(mode="hybrid")``)."""

    def __init__(self, client: Client | None, collection: str, *, async_client: AsyncClient | None = None,
                 top_k: int = 4, filter: str | None = None, options: SearchOptions | None = None,  # noqa: A002
                 **kwargs: Any):
        if client is None and async_client is None:
            raise ConfigError("RagCacheRetriever needs a Client, an AsyncClient, or both")
        super().__init__(**kwargs)
        self.client = client
        self.async_client = async_client
        self.collection = collection
        self.top_k = top_k
        self.filter = filter
        self.options = options

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self.client is None:
            raise ConfigError("this RagCacheRetriever has only an AsyncClient: use aretrieve, or pass client=")
        return _nodes(self.client.search(query_bundle.query_str, self.collection, top_k=self.top_k, filter=self.filter,
                                        options=self.options))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self.async_client is None:
            return await asyncio.to_thread(self._retrieve, query_bundle)
        result = await self.async_client.search(query_bundle.query_str, self.collection, top_k=self.top_k,  # type: ignore[misc]
                                                filter=self.filter, options=self.options)
        return _nodes(result)
