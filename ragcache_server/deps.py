"""What every route takes from the service, in one place: the state, the cache a caller embeds through,
worker-thread calls and the request limits. Routes import these from here, never from one another."""

from __future__ import annotations

import functools
from functools import partial

from fastapi import Request
from prometheus_client import CollectorRegistry

from ragcache.core import EmbeddingCache, Scope
from ragcache.prefixes import PrefixRegistry
from ragcache_server.auth import principal_of
from ragcache_server.errors import HTTPError
from ragcache_server.state import ServiceState
from ragcache_server.workers import current_pool

__all__ = ["blocking", "cache_of", "check_count", "check_text_size", "prefixes_of", "metrics_registry_of", "rerank_scope",
           "served_count_headers", "state_of"]


def state_of(request: Request) -> ServiceState:
    return request.app.state.ragcache


def prefixes_of(request: Request) -> PrefixRegistry:
    return request.app.state.prefixes


def metrics_registry_of(request: Request) -> CollectorRegistry:
    return request.app.state.metrics_registry


def cache_of(request: Request, model: str | None, prompt_name: str | None = None, *, optional: bool = False) -> EmbeddingCache:
    """The cache this caller embeds through: the model's (under a named prompt, ``ragcache.models.prompts``), or its
    tenant's own namespace of it. An unknown ``prompt_name`` is a 422, or with ``optional`` no prompt."""
    return request.app.state.tenant_caches.cache_for(model, principal_of(request).tenant, prompt_name, optional=optional)


def rerank_scope(request: Request) -> Scope:
    """The caller's tenant when tenants keep their own cache entries: then its scores are its own too."""
    return request.app.state.tenant_caches.scope(principal_of(request).tenant)


def check_count(items: list, field: str, max_batch: int) -> None:
    """413 for a list (texts, documents, ids) longer than ``max_batch``."""
    if len(items) > max_batch:
        raise HTTPError(413, f"{field} has {len(items)} items, over this server's limit of {max_batch}: split the batch", field=field)


def check_text_size(text: str, field: str, max_text_bytes: int) -> None:
    """413 for a text over ``max_text_bytes`` UTF-8 bytes: the model would truncate it anyway, but hashing
    and tokenizing megabytes would cost the server first."""
    # A code point is at most 4 bytes: most texts are judged by their length alone, without encoding.
    if len(text) * 4 <= max_text_bytes:
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_text_bytes:
        message = f"{field} has {size} UTF-8 bytes, over this server's limit of {max_text_bytes} (RAGCACHE_MAX_TEXT_BYTES)"
        raise HTTPError(413, message, field=field)


async def blocking(function, *args, **kwargs):
    """Run a blocking call (Redis, Milvus, the model) in a worker thread, abandoned at the request deadline;
    at most ``max_worker_threads`` at once, abandoned ones counted until they end (ragcache_server/workers.py)."""
    return await current_pool.get().run(partial(function, *args, **kwargs))


@functools.cache
def _served_header(level: str) -> str:
    return f"X-Cache-{level.capitalize()}"


def served_count_headers(served: dict[str, int]) -> dict[str, str]:
    """``X-Cache-<level>`` per level and ``X-Cache-Hit-Rate``, from how many items each level served."""
    headers = {_served_header(name): str(count) for name, count in served.items()}
    total = sum(served.values())
    headers["X-Cache-Hit-Rate"] = f"{(total - served.get('compute', 0)) / total:.4f}" if total else "0"
    return headers
