"""Which URLs a prefix may make the service call: the SSRF guard of the registry (issue 27, item 2).

A prefix names URLs (its target, its replicas, an LMCache controller) that the service then POSTs to and GETs
from, on its own network. A caller must therefore never choose them freely: with ``restrict_targets`` (the
service turns it on whenever it has API keys, is bound beyond loopback, or the operator listed any endpoint), a
URL is accepted only when the operator configured it: ``endpoints`` (``RAGCACHE_PREFIX_VLLM_ENDPOINTS``),
``allowed_targets`` (every tenant) or ``tenant_targets[tenant]``. Whatever the mode, a URL with credentials,
a query or a fragment is refused: a ``?x=`` would turn the path the service appends into a query, and userinfo
would carry credentials the operator never gave.

URLs are compared in one canonical form (scheme and host lower case, no trailing slash), so ``HTTP://VLLM:8000/``
on the list allows ``http://vllm:8000``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ragcache.errors import InvalidInputError

if TYPE_CHECKING:  # config.py canonicalises its endpoints with canonical_url: no import cycle at run time
    from .config import PrefixRegistryConfig

__all__ = ["TargetPolicy", "canonical_url", "tenant_of"]

# What separates a tenant from its prefix's public name in a stored name (ragcache.retrieval.names.SEPARATOR).
_SEPARATOR = "--"


def canonical_url(url: object, field: str) -> str:
    """``url`` in canonical form when it is a plain http(s) base URL; :class:`InvalidInputError` naming ``field``
    otherwise (no credentials, query, fragment, whitespace or backslash)."""
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 or c == "\\" for c in url):
        raise InvalidInputError("must be an http(s) base URL without spaces or control characters", field=field)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidInputError("must be an http(s) base URL (its port is not a number)", field=field) from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidInputError("must be an http(s) base URL with a host", field=field)
    if parts.username is not None or parts.password is not None:
        raise InvalidInputError("must not carry credentials (user:password@)", field=field)
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise InvalidInputError("must not carry a query or a fragment (the service appends its own paths)", field=field)
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme.lower()}://{netloc}{parts.path.rstrip('/')}"


def tenant_of(stored_name: str) -> str | None:
    """The tenant a stored prefix name belongs to (``acme--system`` -> ``acme``); None for a name without one."""
    tenant, separator, _ = stored_name.partition(_SEPARATOR)
    return tenant if separator and tenant else None


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
