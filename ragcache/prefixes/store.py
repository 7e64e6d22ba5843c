"""Where registered prefixes live: a Redis hash shared by every replica, or a local JSON file.

Both stores keep one record per prefix name (the current version); older versions are not kept
because nothing warms or renders them any more.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Protocol

import redis

from ragcache.errors import TierUnavailableError
from ragcache.storage.redis_client import REDIS_ERRORS

from .model import Prefix

__all__ = ["PrefixStore", "RedisPrefixStore", "FilePrefixStore", "make_store"]


class PrefixStore(Protocol):
    """The storage interface the registry needs."""

    def get(self, name: str) -> Prefix | None: ...

    def list(self) -> list[Prefix]: ...

    def names(self) -> tuple[str, ...]:
        """Every stored name (what the per-tenant bound counts, without reading each text)."""
        ...

    def put(self, prefix: Prefix) -> None: ...

    def delete(self, name: str) -> bool: ...


class RedisPrefixStore:
    """All prefixes in one Redis hash (``name -> JSON``), so every replica sees the same registry.

    One key, so on a Redis Cluster the whole registry lives on one node (a few KB; every command names
    that one key, so none crosses slots)."""

    def __init__(self, client: redis.Redis, key: str = "rc:prefixes") -> None:
        self._client = client
        self._key = key

    def _call(self, op: str, *args: object) -> object:
        try:
            return getattr(self._client, op)(self._key, *args)
        except REDIS_ERRORS as exc:
            raise TierUnavailableError("prefix-store", f"redis {op} failed: {exc}") from exc

    def get(self, name: str) -> Prefix | None:
        raw = self._call("hget", name)
        return Prefix.from_json(json.loads(raw)) if raw else None  # type: ignore[arg-type]

    def list(self) -> list[Prefix]:
        raw = self._call("hvals")
        return sorted((Prefix.from_json(json.loads(v)) for v in raw), key=lambda p: p.name)  # type: ignore[attr-defined]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(n.decode() if isinstance(n, bytes) else n for n in self._call("hkeys")))  # type: ignore[attr-defined]

    def put(self, prefix: Prefix) -> None:
        self._call("hset", prefix.name, json.dumps(prefix.to_json()))

    def delete(self, name: str) -> bool:
        return bool(self._call("hdel", name))


class FilePrefixStore:
    """The registry in one JSON file, for a single process with no Redis.

    Every call re-reads the file, and writes go through a temporary file and ``os.replace`` so a
    crash never leaves a half-written registry behind.
    """

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()

    def _read(self) -> dict[str, dict]:
        try:
            return json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise TierUnavailableError("prefix-store", f"cannot read {self._path}: {exc}") from exc

    def _write(self, records: dict[str, dict]) -> None:
        tmp = self._path.with_suffix(self._path.suffix + ".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(records, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self._path)
        except OSError as exc:
            raise TierUnavailableError("prefix-store", f"cannot write {self._path}: {exc}") from exc

    def get(self, name: str) -> Prefix | None:
        with self._lock:
            raw = self._read().get(name)
        return Prefix.from_json(raw) if raw else None

    def list(self) -> list[Prefix]:
        with self._lock:
            records = self._read()
        return [Prefix.from_json(records[n]) for n in sorted(records)]

    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._read()))

    def put(self, prefix: Prefix) -> None:
        with self._lock:
            records = self._read()
            records[prefix.name] = prefix.to_json()
            self._write(records)

    def delete(self, name: str) -> bool:
        with self._lock:
            records = self._read()
            found = records.pop(name, None) is not None
            if found:
                self._write(records)
        return found


def make_store(client: redis.Redis | None, path: Path, key: str = "rc:prefixes") -> PrefixStore:
    """A Redis store when a client is given, else the local-file fallback at ``path``."""
    return RedisPrefixStore(client, key) if client is not None else FilePrefixStore(path)
