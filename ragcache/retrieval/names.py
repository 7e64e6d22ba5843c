"""A tenant's names, resolved in one place: the name a caller knows a collection (or a prompt prefix) by, and the
name it is stored under.

A tenant's collection ``docs`` is stored as ``<tenant>--docs``. Tenant names hold no '-', so the prefix is
unambiguous, and a request for another tenant's collection looks up a name that does not exist: 404, never
403, so names do not leak. Without a tenant (the operator's view) the two names are one.

The knowledge base takes a ``CollectionName`` and raises its errors with the ``public`` name, so a caller
never reads the stored one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragcache.errors import InvalidInputError
from ragcache.retrieval.documents import check_collection_name

__all__ = ["SEPARATOR", "CollectionName", "public_name", "tenant_name", "tenant_prefix"]

SEPARATOR = "--"
MAX_COLLECTION_CHARS = 63  # ragcache.retrieval.documents.COLLECTION_NAME_PATTERN


@dataclass(frozen=True)
class CollectionName:
    """A collection as its caller names it (``public``) and as it is stored (``stored``)."""

    stored: str
    public: str

    @classmethod
    def of(cls, name: str | CollectionName, tenant: str | None = None) -> CollectionName:
        """``name`` (checked) as ``tenant`` names it; a ``CollectionName`` is taken as it is."""
        if isinstance(name, CollectionName):
            return name
        public = check_collection_name(name)
        return cls(tenant_name(tenant, public, MAX_COLLECTION_CHARS, "collection"), public)


def tenant_name(tenant: str | None, name: str, max_chars: int, field: str) -> str:
    """The name ``tenant``'s ``name`` is stored under (``name`` itself without a tenant); ``InvalidInputError``
    naming ``field`` when the stored name would pass ``max_chars``."""
    if tenant is None:
        return name
    stored = f"{tenant}{SEPARATOR}{name}"
    if len(stored) > max_chars:
        limit = max_chars - len(tenant) - len(SEPARATOR)
        raise InvalidInputError(f"{field} {name!r} is too long: at most {limit} characters here", field=field)
    return stored


def tenant_prefix(tenant: str | None) -> str:
    """What the stored name of each of the tenant's collections (and prefixes) starts with ("" without a tenant)."""
    return "" if tenant is None else f"{tenant}{SEPARATOR}"


def public_name(tenant: str | None, stored: str) -> str | None:
    """The name ``tenant`` knows a stored collection (or prefix) by; None when it is not the tenant's."""
    prefix = tenant_prefix(tenant)
    return stored[len(prefix) :] if stored.startswith(prefix) else None
