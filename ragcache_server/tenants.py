"""Tenants: each sees only its own collections and prompt prefixes, and (optionally) hits only its own cache entries.

A tenant's collection ``docs`` is stored as ``<tenant>--docs``, and its prefix ``system`` as ``<tenant>--system``.
Tenant names hold no '-', so the prefix is unambiguous, and a request for another tenant's collection or prefix
looks up a name that does not exist: 404, never 403, so names do not leak. A key without a tenant sees the stored
names (the operator's view).

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
from ragcache_server.state import ServiceState

__all__ = ["SEPARATOR", "stored_collection", "stored_prefix", "tenant_prefix", "public_collection", "public_names",
           "TenantCaches"]

SEPARATOR = "--"
MAX_COLLECTION_CHARS = 63  # ragcache.retrieval.documents.COLLECTION_NAME_PATTERN
MAX_PREFIX_NAME_CHARS = 128  # ragcache.prefixes.model.check_name


def stored_collection(tenant: str | None, name: str) -> str:
    """The name a tenant's collection is stored under (the name itself without a tenant)."""
    return _stored(tenant, name, MAX_COLLECTION_CHARS, "collection")


def stored_prefix(tenant: str | None, name: str, field: str = "name") -> str:
    """The name a tenant's prompt prefix is stored under in the registry (the name itself without a tenant).
    The public name is checked first: '-x' is no prefix name, though 'acme---x' would pass the check."""
    try:
        check_name(name)
    except InvalidInputError as exc:
        raise InvalidInputError(str(exc), field=field) from None
    return _stored(tenant, name, MAX_PREFIX_NAME_CHARS, field)


def _stored(tenant: str | None, name: str, max_chars: int, field: str) -> str:
    if tenant is None:
        return name
    stored = f"{tenant}{SEPARATOR}{name}"
    if len(stored) > max_chars:
        limit = max_chars - len(tenant) - len(SEPARATOR)
        raise InvalidInputError(f"{field} {name!r} is too long: at most {limit} characters here", field=field)
    return stored


def tenant_prefix(tenant: str | None) -> str:
    """What the stored name of each of the tenant's collections starts with ("" without a tenant)."""
    return "" if tenant is None else f"{tenant}{SEPARATOR}"


def public_collection(tenant: str | None, stored: str) -> str | None:
    """The name a tenant knows a stored collection (or prefix) by; None when it is not the tenant's."""
    if tenant is None:
        return stored
    prefix = f"{tenant}{SEPARATOR}"
    return stored[len(prefix) :] if stored.startswith(prefix) else None


@contextmanager
def public_names(stored: str, public: str) -> Iterator[None]:
    """Library errors that name the stored collection say the name the caller sent instead."""
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
