"""LangChain ``Embeddings`` backed by the ragcache service, so a LangChain RAG pipeline embeds through the cache.

    >>> from ragcache.client import Client
    >>> from ragcache.langchain import RagCacheEmbeddings
    >>> embeddings = RagCacheEmbeddings(Client("http://127.0.0.1:8000"))
    >>> vector = embeddings.embed_query("What is a KV cache?")

``langchain-core`` is an optional dependency (``pip install 'ragcache[langchain]'``); importing this module
without it raises an ``ImportError`` that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache.errors import ConfigError

try:
    from langchain_core.embeddings import Embeddings
except ImportError as exc:  # pragma: no cover - exercised only where langchain-core is absent
    raise ImportError(
        "ragcache.langchain needs langchain-core: pip install 'ragcache[langchain]' (or langchain-core)"
    ) from exc

if TYPE_CHECKING:
    from ragcache.client import AsyncClient, Client

__all__ = ["RagCacheEmbeddings"]


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
