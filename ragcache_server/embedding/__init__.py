"""The embedding edge: ``/embed``, TEI's ``POST /``, ``/v1/embeddings``, ``/tokenize`` and ``/decode``.

One request passes, in order: ``fast_path`` (the three embedding routes without FastAPI's layers) or ``routes`` (the
FastAPI routes and the OpenAPI schema), then ``plan`` (every decision, once: texts, cache view, truncation, token
counts, the caller's key), ``walk`` (the one continuation from L1's probe to the vectors, through ``groups`` when
requests miss together) and ``wire`` (TEI's and OpenAI's bytes). ``tokens`` keeps OpenAI's token counts per text;
``passthrough`` reads a caller's own provider key. Errors are shaped per route family by ``ragcache_server.errors``.
"""

from ragcache_server.embedding.fast_path import EmbedFastPath, FastPathCounts
from ragcache_server.embedding.groups import MAX_GROUP_TEXTS, EmbedGroups
from ragcache_server.embedding.routes import answer, router

__all__ = ["MAX_GROUP_TEXTS", "EmbedFastPath", "EmbedGroups", "FastPathCounts", "answer", "router"]
