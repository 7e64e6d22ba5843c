"""The embedding edge: ``/embed``, TEI's ``POST /``, ``/v1/embeddings``, ``/tokenize`` and ``/decode``.

One request passes ``answers`` (the three embedding routes without FastAPI's layers, or FastAPI's routes in
``routes`` for what that hands over: the OpenAPI schema), which asks ``plan`` for every decision, once (texts, cache
view, truncation, token counts, the caller's own provider key), then walks to the vectors (through ``groups`` when
requests miss together) and writes TEI's or OpenAI's bytes. ``tokens`` keeps OpenAI's token counts per text. Errors
are shaped per route family by ``ragcache_server.error_shapes``.
"""

from ragcache_server.embedding.answers import EmbedFastPath, FastPathCounts, answer
from ragcache_server.embedding.groups import MAX_GROUP_TEXTS, EmbedGroups
from ragcache_server.embedding.routes import router

__all__ = ["MAX_GROUP_TEXTS", "EmbedFastPath", "EmbedGroups", "FastPathCounts", "answer", "router"]
