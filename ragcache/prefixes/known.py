"""The prefix store as this process sees it: every read and write goes to the store, and the last copy of each prefix
is kept, so that rendering and the keep-warm loop go on while the store (Redis, the local file) is down."""

from __future__ import annotations

import threading

from ragcache.errors import NotFoundError, TierUnavailableError

from .model import Prefix, PrefixName
from .store import PrefixStore

__all__ = ["KnownPrefixes"]


class KnownPrefixes:
    """A :class:`~.store.PrefixStore` and this process's last copy of what it held (thread-safe)."""

    def __init__(self, store: PrefixStore) -> None:
        self.store = store
        self._copies: dict[str, Prefix] = {}
        self._lock = threading.Lock()

    def get(self, name: PrefixName) -> Prefix:
        """The current version of prefix ``name``, as stored (the last copy while the store is down);
        :class:`NotFoundError` naming the public name when there is none."""
        try:
            prefix = self.store.get(name.stored)
        except TierUnavailableError:
            prefix = self._copies.get(name.stored)  # serve the last copy while the store is down
        if prefix is None:
            raise NotFoundError(f"no prefix named {name.public!r}")
        return prefix

    def put(self, prefix: Prefix) -> None:
        """Store ``prefix`` (the store's failure propagates) and keep its copy."""
        self.store.put(prefix)
        with self._lock:
            self._copies[prefix.name] = prefix

    def delete(self, name: PrefixName) -> None:
        """Delete prefix ``name`` and its copy; :class:`NotFoundError` naming the public name when the store does not
        hold it."""
        if not self.store.delete(name.stored):
            raise NotFoundError(f"no prefix named {name.public!r}")
        with self._lock:
            self._copies.pop(name.stored, None)

    def replace(self, listed: list[Prefix]) -> None:
        """Keep copies of exactly ``listed`` (the store's whole list, just read)."""
        with self._lock:
            self._copies = {prefix.name: prefix for prefix in listed}

    def copies(self) -> list[Prefix]:
        """The last copy of every prefix, by name."""
        with self._lock:
            return sorted(self._copies.values(), key=lambda prefix: prefix.name)
