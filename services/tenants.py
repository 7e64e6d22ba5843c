"""Tenants: each sees only its own collections, and (optionally) hits only its own cache entries.

A tenant's collection ``docs`` is stored as ``<tenant>--docs``. Tenant names hold no '-', so the prefix is
unambiguous, and a request for another tenant's collection looks up a name that does not exist: 404, never
403, so names do not leak. A key without a tenant sees the stored names (the operator's view).

With ``tenant_cache_namespaces`` a tenant embeds through its own ``EmbeddingCache`` whose space carries the
tenant as ``namespace``: the same model and vectors under other keys, so a text another tenant embedded is
still a miss (no hit to time, no ``X-Cache-L1`` to read). The L1 slab is shared (one memory budget, keys
differ by space); L2 keys and L3 collections are per space, so those are separate too.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ragcache.build import build_cache
from ragcache.cache import EmbeddingCache
from ragcache.errors import ConflictError, InvalidInputError, NotFoundError
from services.state import ServiceState

__all__ = ["SEPARATOR", "stored_collection", "tenant_prefix", "public_collection", "public_names", "TenantCaches"]

SEPARATOR = "--"
MAX_COLLECTION_CHARS = 63  # ragcache.documents.COLLECTION_NAME_PATTERN


def stored_collection(tenant: str | None, name: str) -> str:
    """The name a tenant's collection is stored under (the name itself without a tenant)."""
    if tenant is None:
        return name
    stored = f"{tenant}{SEPARATOR}{name}"
    if len(stored) > MAX_COLLECTION_CHARS:
        limit = MAX_COLLECTION_CHARS - len(tenant) - len(SEPARATOR)
        raise InvalidInputError(f"collection name {name!r} is too long: at most {limit} characters here", field="collection")
    return stored


def tenant_prefix(tenant: str | None) -> str:
    """What the stored name of each of the tenant's collections starts with ("" without a tenant)."""
    return "" if tenant is None else f"{tenant}{SEPARATOR}"


def public_collection(tenant: str | None, stored: str) -> str | None:
    """The name a tenant knows a stored collection by; None when it is not the tenant's."""
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


class NamespacedEncoder:
    """A model under a tenant's namespace: its encoder's vectors, a space (and so keys) of its own."""

    def __init__(self, encoder, namespace: str):
        self._encoder = encoder
        self.space = dataclasses.replace(encoder.space, namespace=namespace)
        self.device = encoder.device

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        return self._encoder.encode(texts)

    def stats(self):
        return self._encoder.stats()

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._encoder.count_tokens(texts)

    def check_lengths(self, texts: Sequence[str], field: str = "inputs") -> None:
        self._encoder.check_lengths(texts, field)

    def tokenize(self, texts: Sequence[str], *, add_special_tokens: bool = True):
        return self._encoder.tokenize(texts, add_special_tokens=add_special_tokens)

    def decode(self, ids, *, skip_special_tokens: bool = True) -> list[str]:
        return self._encoder.decode(ids, skip_special_tokens=skip_special_tokens)


class TenantCaches:
    """The cache a request embeds through: the model's shared cache, or its tenant's own (made on first use;
    tenants come from the key file, so there are as many as configured)."""

    def __init__(self, state: ServiceState, *, enabled: bool):
        self.state = state
        self.enabled = enabled
        self._caches: dict[tuple[str, str | None], EmbeddingCache] = {}
        self._lock = threading.Lock()

    def cache_for(self, model: str | None, tenant: str | None, prompt_name: str | None = None, *, optional: bool = False) -> EmbeddingCache:
        shared = self.state.cache_for(model, prompt_name, optional=optional)
        if not self.enabled or tenant is None:
            return shared
        with self._lock:
            cache = self._caches.get((shared.encoder.space.space_id, tenant))
            if cache is None:
                cache = self._caches[(shared.encoder.space.space_id, tenant)] = self._build(shared, tenant)
            return cache

    def _build(self, shared: EmbeddingCache, tenant: str) -> EmbeddingCache:
        encoder = NamespacedEncoder(shared.encoder, tenant)
        # The first level is the memory slab (build_cache): shared, so tenants add no memory budget.
        # The model's generation is shared too: a drift switch moves the tenants' keys with the model's.
        return build_cache(
            self.state.settings, self.state.stores, encoder, l1=shared.tiers[0], generation=shared.generation  # type: ignore[arg-type]
        )

    def caches(self) -> list[EmbeddingCache]:
        """The tenants' caches made so far (for the metrics: their hits are not in the shared caches')."""
        with self._lock:
            return list(self._caches.values())

    def close(self) -> None:
        """Flush the tenants' queued writes (before the shared stores close)."""
        with self._lock:
            caches, self._caches = list(self._caches.values()), {}
        for cache in caches:
            cache.close()
