"""Which prefixes requests use (:class:`PrefixUse`): the uses clients report and when a prefix was last active, so
keep-warm can put the prefixes in use first and leave an idle one only the budget's room (issue 42, item 5)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .config import PrefixRegistryConfig

__all__ = ["PrefixUse"]


class PrefixUse:
    """Uses and activity per prefix name (thread-safe; a leaf lock: nothing is called while it is held)."""

    def __init__(self, config: PrefixRegistryConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._uses: dict[str, int] = {}  # prefix name -> requests that used it (reported by clients)
        # prefix name -> when a request last used it (a use reported, a route asked; monotonic), or it was first seen.
        self._active_at: dict[str, float] = {}

    def seen(self, name: str) -> None:
        """Prefix ``name`` is known here: idle from now on until a use, unless it was seen before."""
        now = self._clock()
        with self._lock:
            self._active_at.setdefault(name, now)

    def record_use(self, name: str, count: int) -> None:
        """Count ``count`` more requests that used prefix ``name``."""
        now = self._clock()
        with self._lock:
            self._uses[name] = self._uses.get(name, 0) + count
            if count:
                self._active_at[name] = now

    def record_activity(self, name: str) -> None:
        """A request is about to use prefix ``name`` (a route was asked for it): it is not idle."""
        now = self._clock()
        with self._lock:
            self._active_at[name] = now

    def num_uses(self, name: str) -> int:
        """Requests reported to have used prefix ``name``."""
        with self._lock:
            return self._uses.get(name, 0)

    def idle_s(self, name: str) -> float | None:
        """For how long prefix ``name`` has been idle (no request used it for ``idle_after_s``); None while in use."""
        now = self._clock()
        with self._lock:
            quiet_s = now - self._active_at.setdefault(name, now)
        return quiet_s if quiet_s >= self._config.idle_after_s else None

    def idle_reserve(self, per_minute: int | None = None) -> int:
        """Warms of each minute's budget (``per_minute`` as sized now, else the configured one) an idle prefix's warm
        leaves to the prefixes in use."""
        budget = min(per_minute or self._config.warm_budget_per_minute, self._config.warm_budget_per_tenant_per_minute)
        return int(budget * self._config.idle_budget_share)

    def forget(self, name: str) -> None:
        """Drop prefix ``name``'s uses and activity (it was deleted)."""
        with self._lock:
            self._uses.pop(name, None)
            self._active_at.pop(name, None)
