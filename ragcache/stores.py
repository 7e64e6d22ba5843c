"""The connections a process opens once and shares: Redis or a Redis Cluster (L2, the prefix registry,
search results) and Milvus (L3 and the knowledge base), plus the embedded Redis server when no URL is configured.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import redis
from pymilvus import MilvusClient
from redis.cluster import RedisCluster

from ragcache.embedded_redis import EmbeddedRedis
from ragcache.errors import ConfigError, TierUnavailableError
from ragcache.redis_client import open_redis
from ragcache.settings import Settings

__all__ = ["ReconnectingMilvus", "Stores", "connect_milvus", "open_milvus"]

log = logging.getLogger(__name__)


def open_milvus(uri: str) -> MilvusClient:
    """A Milvus client: Milvus Lite for a path ending in ``.db``, a server for ``http(s)://``."""
    if uri.endswith(".db"):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
    elif not uri.startswith(("http://", "https://", "tcp://")):
        raise ConfigError(f"milvus_uri {uri!r}: use a path ending in .db (Milvus Lite) or http://host:port")
    try:
        return MilvusClient(uri)
    except Exception as exc:  # pymilvus raises several unrelated types when it cannot connect
        raise ConfigError(f"cannot open Milvus at {uri}: {exc}") from exc


class ReconnectingMilvus:
    """A Milvus server client that may start while the server is down, and connects when it is back.

    pymilvus connects when a ``MilvusClient`` is made, so a server down at start-up would stop the service,
    where a server that goes down later only makes L3 and the knowledge base fail (a miss, or a 503). Here
    every use first makes sure a client exists; while none can be made, the use raises
    ``TierUnavailableError``, which the levels and the knowledge base already treat as an outage (with
    back-off, so a down server is not asked on every request). Milvus Lite (a ``.db`` path) is never
    wrapped: failing to open a local file is a configuration error, to report at once.
    """

    def __init__(self, uri: str):
        self.uri = uri
        self._client: MilvusClient | None = None
        self._lock = threading.Lock()
        try:
            self._connected()
        except TierUnavailableError as exc:
            log.warning("%s; starting without it: L3 misses and the knowledge base answers 503 until it is back", exc)

    def _connected(self) -> MilvusClient:
        with self._lock:
            if self._client is None:
                try:
                    self._client = MilvusClient(self.uri)
                except Exception as exc:  # pymilvus raises several unrelated types when it cannot connect
                    raise TierUnavailableError("Milvus", f"cannot reach the server at {self.uri}: {exc}") from exc
            return self._client

    def __getattr__(self, name: str):
        return getattr(self._connected(), name)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def connect_milvus(uri: str) -> MilvusClient | ReconnectingMilvus:
    """Milvus Lite opened now (errors at once), or a server client that tolerates a server down at start."""
    if uri.startswith(("http://", "https://", "tcp://")):
        return ReconnectingMilvus(uri)
    return open_milvus(uri)


class Stores:
    """Shared clients. ``redis`` is None when L2 is off, a ``RedisCluster`` when the URL names a cluster
    (see ``ragcache.redis_client``); ``milvus`` is None when L3 is off."""

    def __init__(self, redis_client: redis.Redis | RedisCluster | None, milvus: MilvusClient | None, embedded: EmbeddedRedis | None = None):
        self.redis = redis_client
        self.milvus = milvus
        self.embedded_redis = embedded

    @classmethod
    def open(cls, settings: Settings) -> Stores:
        embedded = None
        redis_client = None
        if settings.l2_enabled:
            url = settings.redis_url
            if url is None:
                embedded = EmbeddedRedis(settings.data_dir / "redis")
                url = embedded.url
            redis_client = open_redis(url, timeout_s=settings.redis_timeout_s)
        uri = settings.resolved_milvus_uri
        milvus = connect_milvus(uri) if uri else None
        return cls(redis_client, milvus, embedded)

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()
        if self.milvus is not None:
            self.milvus.close()
        if self.embedded_redis is not None:
            self.embedded_redis.stop()
