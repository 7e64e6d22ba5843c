"""The service's levels probed at start and then every few seconds, so ``/health`` says what each level is now.

A level's breaker learns of an outage from the requests that hit it: with none yet (just started) or none for a
while, ``/health`` would say ``ok`` with Redis unreachable. A probe asks each store for one key nobody stores.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from ragcache.core import probe_levels
from ragcache.observe import RepeatedWarnings

__all__ = ["PROBE_INTERVAL_S", "LevelProbes"]

log = logging.getLogger(__name__)
log.addFilter(RepeatedWarnings())  # a probe that keeps breaking says so once a minute, not once an interval

# One round trip per store per interval: nothing next to the traffic, and /health is never more than this stale.
PROBE_INTERVAL_S = 5.0


class LevelProbes:
    """Probes every cache of ``caches`` (a callable: the set may change) once now, then every ``interval_s`` in a
    thread of its own until ``stop``."""

    def __init__(self, caches: Callable[[], Iterable[object]], interval_s: float = PROBE_INTERVAL_S) -> None:
        self._caches = caches
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def probe_once(self) -> None:
        for cache in self._caches():
            probe_levels(cache)

    def start(self) -> LevelProbes:
        """Probe now (before the first request is served), then in the background."""
        self.probe_once()
        self._thread = threading.Thread(target=self._run, name="ragcache-level-probes", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.probe_once()
            except Exception:  # noqa: BLE001 - a probe that breaks must not end the probing
                log.exception("probing the levels failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30)
