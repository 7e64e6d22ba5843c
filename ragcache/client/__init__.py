"""A Python client for the ragcache HTTP service: ``Client`` (blocking) and ``AsyncClient`` (asyncio), over httpx.

    >>> with Client("http://127.0.0.1:8000", api_key="secret") as client:
    ...     vectors = client.embed(["What is a KV cache?"])  # numpy float32 [1, 384]
    ...     client.search("What is a KV cache?", "docs", top_k=3).hits[0].text

    >>> async with AsyncClient() as client:
    ...     vectors = await client.embed(["What is a KV cache?"])

The KV-prefix registry's operations are here too (``register_prefix``, ``get_prefix``, ``warm_prefix``, ...),
and ``render``/``messages`` build prompts locally from a registered prefix, byte for byte prefix-first, with
retrieved chunks in a cache-friendly order (:func:`ragcache.prefixes.assemble_prompt`); the prefix is fetched
once per ``prefix_refresh_s`` and uses are reported in batches (on refresh, or :meth:`flush_uses`). With
``route=True`` they also ask the service where to send the request (``POST /prefixes/{name}/route``) and return a
``RoutedPrompt`` / ``RoutedMessages``: the prompt or messages with the chosen vLLM ``endpoint`` and its ``reason``.

Every operation is written once (``_Operations``): it builds a ``_Call`` (method, path, JSON body, how to
read the answer), and each class only sends it, so the two clients cannot drift apart. ``transport=`` is
the test seam (``httpx.MockTransport``, ``httpx.ASGITransport``).

Errors are the library's own tree, carrying the server's message and a ``status_code`` attribute:

    RagCacheError
    ├── InvalidInputError        400, 413, 422 (``field`` as the server named it)
    ├── NotFoundError            404 (``field``: ``collection`` or ``model``, as the server named what is missing)
    ├── ConflictError            409
    ├── AuthenticationError      401 (saying to pass ``Client(api_key=...)``), 403   (defined here)
    ├── ServiceUnavailableError  cannot connect, timed out, 429 or 502/503/504       (defined here)
    └── ServiceError             any other failed answer, or one that is not the expected JSON (defined here)

Connection failures and 429/502/503 answers are retried ``retries`` times with exponential back-off, or
after the ``Retry-After`` the service sent when that is longer (capped at ``MAX_RETRY_AFTER_S``): nothing
reached the application, or it asked to be retried. Every endpoint is idempotent (upserts and deletes
go by id), but a read timeout is not retried (the request may still be running), nor is any 4xx, which is
the caller's to fix.
"""

from ragcache.client._clients import AsyncClient, Client
from ragcache.client._operations import DEFAULT_BASE_URL
from ragcache.client._routed import RoutedMessages, RoutedPrompt
from ragcache.client._wire import SearchResponse
from ragcache.errors import AuthenticationError, ServiceError, ServiceUnavailableError
from ragcache.retrieval.ranking import SearchOptions

__all__ = [
    "Client",
    "AsyncClient",
    "SearchResponse",
    "RoutedPrompt",
    "RoutedMessages",
    "SearchOptions",
    "AuthenticationError",
    "ServiceUnavailableError",
    "ServiceError",
    "DEFAULT_BASE_URL",
]
