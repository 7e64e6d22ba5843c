"""A tenant's names, resolved in one place: the name a caller knows a collection (or a prompt prefix) by, and the
name it is stored under.

A tenant's collection ``docs`` is stored as ``<tenant>--docs``. Tenant names hold no '-', so the prefix is
unambiguous, and a request for another tenant's collection looks up a name that does not exist: 404, never
403, so names do not leak. Without a tenant (the operator's view) the two names are one.

The knowledge base takes a ``CollectionName``, the prefix registry a ``PrefixName`` (``ragcache.prefixes.model``),
both a ``TenantName``: they raise their errors, and the registry gives its answers, with the ``public`` name,
so a caller never reads the stored one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

from ragcache.errors import InvalidInputError
from ragcache.retrieval.documents import MAX_COLLECTION_CHARS, check_collection_name

__all__ = ["SEPARATOR", "CollectionName", "TenantName", "own_named", "public_name", "tenant_name", "tenant_of", "tenant_prefix"]

SEPARATOR = "--"

Named = TypeVar("Named")  # an answer with a ``name`` field: a collection's info, a prefix, a warm, stats


@dataclass(frozen=True)
class TenantName:
    """A name as its caller knows it (``public``) and as it is stored (``stored``). A kind of name (a collection,
    a prompt prefix) says how a public name is checked, how long a stored one may be and which field errors name."""

    stored: str
    public: str

    FIELD: ClassVar[str]
    MAX_CHARS: ClassVar[int]

    @staticmethod
    def check(name: object, field: str) -> str:
        """``name`` when it is a valid public name; ``InvalidInputError`` naming ``field`` otherwise."""
        raise NotImplementedError

    @classmethod
    def of(cls, name: str | Self, tenant: str | None = None, field: str | None = None) -> Self:
        """``name`` (checked) as ``tenant`` names it; errors name ``field`` (default: the kind's). A resolved
        name is taken as it is."""
        if isinstance(name, cls):
            return name
        field = cls.FIELD if field is None else field
        public = cls.check(name, field)
        return cls(tenant_name(tenant, public, cls.MAX_CHARS, field), public)

    def named(self, item: Named) -> Named:
        """``item`` (a dataclass with a ``name``, read under the stored name) under the public name."""
        if self.stored == self.public:
            return item
        return dataclasses.replace(item, name=self.public)  # type: ignore[type-var]


@dataclass(frozen=True)
class CollectionName(TenantName):
    """A knowledge-base collection's name."""

    FIELD = "collection"
    MAX_CHARS = MAX_COLLECTION_CHARS

    @staticmethod
    def check(name: object, field: str) -> str:
        return check_collection_name(name)


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


def tenant_of(stored: str) -> str | None:
    """The tenant a stored name belongs to (``acme--system`` -> ``acme``); None for a name without one."""
    tenant, separator, _ = stored.partition(SEPARATOR)
    return tenant if separator and tenant else None


def public_name(tenant: str | None, stored: str) -> str | None:
    """The name ``tenant`` knows a stored collection (or prefix) by; None when it is not the tenant's."""
    prefix = tenant_prefix(tenant)
    return stored[len(prefix) :] if stored.startswith(prefix) else None


def own_named(tenant: str | None, items: Iterable[Any]) -> list[Any]:
    """Those of ``items`` (each with a stored ``name``) that are ``tenant``'s, under their public names: what a
    listing shows the tenant (everything, as stored, without a tenant)."""
    own = [(item, public_name(tenant, item.name)) for item in items]
    return [item if name == item.name else dataclasses.replace(item, name=name) for item, name in own if name is not None]
