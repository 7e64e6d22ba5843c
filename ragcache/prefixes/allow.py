"""Which URLs a prefix may make the service call: the SSRF guard of the registry (issue 27, item 2).

A prefix names URLs (its target, its replicas, an LMCache controller) that the service then POSTs to and GETs
from, on its own network. A caller must therefore never choose them freely: with ``restrict_targets`` (the
service turns it on whenever it has API keys, is bound beyond loopback, or the operator listed any endpoint), a
URL is accepted only when the operator configured it: ``endpoints`` (``RAGCACHE_PREFIX_VLLM_ENDPOINTS``),
``allowed_targets`` (every tenant) or ``tenant_targets[tenant]``. Whatever the mode, a URL with credentials,
a query or a fragment is refused: a ``?x=`` would turn the path the service appends into a query, and userinfo
would carry credentials the operator never gave.

URLs are compared in one canonical form (``ragcache.outbound.canonical_url``: scheme and host lower case, no trailing
slash), so ``HTTP://VLLM:8000/`` on the list allows ``http://vllm:8000``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ragcache.errors import InvalidInputError
from ragcache.outbound import canonical_url

from .config import PrefixRegistryConfig

__all__ = ["TargetPolicy"]


class TargetPolicy:
    """The operator's allow-list of URLs, per tenant (see the module docstring)."""

    def __init__(self, config: PrefixRegistryConfig) -> None:
        self.restricted = config.restrict_targets
        shared = (*config.endpoints, *config.allowed_targets)
        self._shared = frozenset(canonical_url(url, "allowed_targets") for url in shared)
        self._per_tenant: Mapping[str, frozenset[str]] = {
            tenant: frozenset(canonical_url(url, "tenant_targets") for url in urls)
            for tenant, urls in config.tenant_targets.items()
        }

    def allows(self, url: str, tenant: str | None) -> bool:
        """Whether a prefix of ``tenant`` may make the service call ``url`` (already canonical)."""
        if not self.restricted:
            return True
        return url in self._shared or url in self._per_tenant.get(tenant or "", frozenset())

    def check(self, url: object, tenant: str | None, field: str) -> str:
        """``url`` canonical, when it is well-formed and allowed for ``tenant``; :class:`InvalidInputError` naming
        ``field`` otherwise. The message never lists the allowed URLs: they are the operator's, not the caller's."""
        canonical = canonical_url(url, field)
        if not self.allows(canonical, tenant):
            raise InvalidInputError(
                f"{canonical} is not a vLLM endpoint this service may call: the operator lists them "
                "(RAGCACHE_PREFIX_VLLM_ENDPOINTS, RAGCACHE_PREFIX_ALLOWED_TARGETS or RAGCACHE_PREFIX_TENANT_TARGETS)",
                field=field)
        return canonical

    def allowed_of(self, urls: Iterable[str], tenant: str | None) -> tuple[str, ...]:
        """Those of ``urls`` that ``tenant``'s prefixes may still call (a record stored before the operator narrowed
        the list, or before this guard existed, is not warmed where it may no longer go)."""
        return tuple(url for url in urls if self._allows_stored(url, tenant))

    def _allows_stored(self, url: str, tenant: str | None) -> bool:
        try:
            return self.allows(canonical_url(url, "url"), tenant)
        except InvalidInputError:
            return False
