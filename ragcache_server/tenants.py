"""Tenants: each sees only its own collections and prompt prefixes, and (optionally) hits only its own cache entries.

Names are resolved in the library (``ragcache.retrieval.names``): a tenant's collection ``docs`` is stored as
``<tenant>--docs``, its prefix ``system`` as ``<tenant>--system``, and a request for another tenant's collection or
prefix looks up a name that does not exist: 404, never 403, so names do not leak. A key without a tenant sees the
stored names (the operator's view). The knowledge base raises its errors with the name the caller sent
(``CollectionName``); the prefix registry does not know it, so its errors are named here (``public_names``).

With ``tenant_cache_namespaces`` a tenant's requests carry it in their scope (``ragcache.core.scope``): the space
carries the tenant as ``namespace``, so the same model and vectors sit under other keys, and a text another
tenant embedded is still a miss (no hit to time, no ``X-Cache-L1`` to read). One cache per model serves every
tenant: one L1 budget, one set of threads and breakers; L3 keeps each namespace in its own collection.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ragcache.core.cache import EmbeddingCache
from ragcache.errors import ConflictError, InvalidInputError, NotFoundError
from ragcache.prefixes.model import check_name
from ragcache.retrieval.names import tenant_name
from ragcache_server.state import ServiceState

__all__ = ["stored_prefix", "public_names", "TenantCaches"]

MAX_PREFIX_NAME_CHARS = 128  # ragcache.prefixes.model.check_name


def stored_prefix(tenant: str | None, name: str, field: str = "name") -> str:
    """The name a tenant's prompt prefix is stored under in the registry (the name itself without a tenant).
    The public name is checked first: '-x' is no prefix name, though 'acme---x' would pass the check."""
    try:
        check_name(name)
    except InvalidInputError as exc:
        raise InvalidInputError(str(exc), field=field) from None
    return tenant_name(tenant, name, MAX_PREFIX_NAME_CHARS, field)


@contextmanager
def public_names(stored: str, public: str) -> Iterator[None]:
    """The prefix registry's errors that name the stored prefix say the name the caller sent instead."""
    try:
        yield
    except (NotFoundError, ConflictError, InvalidInputError) as exc:
        if stored == public:
            raise
        message = str(exc).replace(repr(stored), repr(public))
        if isinstance(exc, InvalidInputError):
            raise InvalidInputError(message, field=exc.field) from None
        raise type(exc)(message) from None


class TenantCaches:
    """The cache a request embeds through: the model's, seen from the request's scope (``EmbeddingCache.scoped``):
    its prompt and (``tenant_cache_namespaces``) its tenant. No cache, threads or levels of its own; its traffic
    is counted both in the model's figures and, per tenant, in ``namespace_stats`` (/stats)."""

    def __init__(self, state: ServiceState, *, enabled: bool):
        self.state = state
        self.enabled = enabled

    def cache_for(self, model: str | None, tenant: str | None, prompt_name: str | None = None, *, optional: bool = False) -> EmbeddingCache:
        return self.state.cache_for(model, prompt_name, optional=optional, tenant=tenant if self.enabled else None)
