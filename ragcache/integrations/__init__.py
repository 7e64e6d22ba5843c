"""Adapters for the frameworks RAG apps use (LangChain, LlamaIndex), over ragcache.client."""
