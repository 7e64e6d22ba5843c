"""Adapters for the frameworks RAG apps use (LangChain, LlamaIndex), over ragcache.client.

Nothing is exported here: each adapter is imported by its module (``ragcache.integrations.langchain``), as each
needs its own framework installed."""

__all__: list[str] = []
