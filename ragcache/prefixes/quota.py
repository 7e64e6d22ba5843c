"""Bounds on what one tenant stores in the registry (issue 27, item 5): the size of a prefix, the number of prefixes,
and registrations in any minute. Prefixes are acknowledged records with no TTL: without bounds one tenant's key
filled the embedded Redis (about 68 prefixes of 15 MB), after which every tenant's L2 and result-cache writes failed.

Keys without a tenant count as one tenant. The registration rate is per replica (a sliding minute in this process);
the prefix count is read from the shared store, so it holds fleet-wide (two registrations racing on two replicas
may each see room for the last one: the bound can be passed by the replicas in flight, never by more).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ragcache.errors import RagCacheError
from ragcache.retrieval.names import tenant_of

from .config import PrefixRegistryConfig
from .policy import WarmBudget

__all__ = ["PrefixLimitError", "PrefixQuota"]


class PrefixLimitError(RagCacheError):
    """A registration over one of the registry's bounds. ``kind`` says which: ``too_large`` (the text),
    ``quota_exceeded`` (prefixes of the tenant), ``rate_limited`` (registrations this minute, ``retry_after_s``)."""

    def __init__(self, kind: str, message: str, *, field: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.field = field
        self.retry_after_s = retry_after_s


class PrefixQuota:
    """The checks ``PrefixRegistry.register`` makes before it stores or contacts anything (thread-safe)."""

    def __init__(self, config: PrefixRegistryConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._registrations: dict[str, WarmBudget] = {}  # tenant ("" without one) -> its sliding minute

    def check_text(self, text: str) -> None:
        """Refuse a prefix text over ``max_text_bytes`` (UTF-8)."""
        num_bytes = len(text.encode("utf-8"))
        if num_bytes > self.config.max_text_bytes:
            raise PrefixLimitError("too_large", f"the prefix text is {num_bytes} bytes; at most {self.config.max_text_bytes} "
                                   "(RAGCACHE_PREFIX_MAX_TEXT_BYTES)", field="text")

    def take_registration(self, tenant: str | None) -> None:
        """Count one registration of ``tenant``; refuse it past ``registrations_per_minute`` in any 60 s."""
        with self._lock:
            window = self._registrations.get(tenant or "")
            if window is None:
                window = self._registrations[tenant or ""] = WarmBudget(self.config.registrations_per_minute, self._clock)
            allowed = window.try_acquire()
        if not allowed:
            raise PrefixLimitError("rate_limited", f"more than {self.config.registrations_per_minute} prefix registrations "
                                   "in a minute (RAGCACHE_PREFIX_REGISTRATIONS_PER_MINUTE); retry later", field="name",
                                   retry_after_s=WarmBudget.window_s / self.config.registrations_per_minute)

    def check_count(self, tenant: str | None, stored_names: Iterable[str]) -> None:
        """Refuse one more prefix for ``tenant`` when it has ``max_prefixes_per_tenant`` already."""
        num_own = sum(1 for name in stored_names if tenant_of(name) == tenant)
        if num_own >= self.config.max_prefixes_per_tenant:
            raise PrefixLimitError("quota_exceeded", f"{num_own} prefixes registered already, at most "
                                   f"{self.config.max_prefixes_per_tenant} (RAGCACHE_PREFIX_MAX_PER_TENANT): delete one "
                                   "first", field="name")
