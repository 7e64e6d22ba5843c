"""Tenants: each sees only its own collections and prompt prefixes, and (optionally) hits only its own cache entries.

Names are resolved in the library (``ragcache.retrieval.names``): a tenant's collection ``docs`` is stored as
``<tenant>--docs``, its prefix ``system`` as ``<tenant>--system``, and a request for another tenant's collection or
prefix looks up a name that does not exist: 404, never 403, so names do not leak. A key without a tenant sees the
stored names (the operator's view). The knowledge base and the prefix registry raise their errors with the name
the caller sent (``CollectionName``, ``PrefixName``), so no message is rewritten here.

With ``tenant_cache_namespaces`` a tenant's requests carry it in their scope (``ragcache.core.scope``): the space
carries the tenant as ``namespace``, so the same model and vectors sit under other keys, and a text another
tenant embedded is still a miss (no hit to time, no ``X-Cache-L1`` to read). One cache per model serves every
tenant: one L1 budget, one set of threads and breakers; L3 keeps each namespace in its own collection.
"""

from __future__ import annotations

from ragcache.core import UNSCOPED, EmbeddingCache, Scope
from ragcache_server.state import ServiceState

__all__ = ["TenantCaches"]


class TenantCaches:
    """The cache a request embeds through: the model's, seen from the request's scope (``EmbeddingCache.scoped``):
    its prompt and (``tenant_cache_namespaces``) its tenant. No cache, threads or levels of its own; its traffic
    is counted both in the model's figures and, per tenant, in ``namespace_stats`` (/stats)."""

    def __init__(self, state: ServiceState, *, enabled: bool):
        self.state = state
        self.enabled = enabled

    def scope(self, tenant: str | None) -> Scope:
        """The scope ``tenant``'s requests carry into a cache (the embedding and the rerank score caches alike)."""
        return Scope(tenant) if self.enabled and tenant is not None else UNSCOPED

    def cache_for(self, model: str | None, tenant: str | None, prompt_name: str | None = None, *, optional: bool = False) -> EmbeddingCache:
        return self.state.cache_for(model, prompt_name, optional=optional, tenant=self.scope(tenant).tenant)
