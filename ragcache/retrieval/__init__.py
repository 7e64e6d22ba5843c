"""Retrieval: the knowledge base in Milvus, keyword search, fusion and ranking, ingest and sync, cached results."""
