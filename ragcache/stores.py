"""The connections a process opens once and shares: Redis or a Redis Cluster (L2, the prefix registry,
search results) and Milvus (L3 and the knowledge base), plus the embedded Redis server when no URL is configured.
"""

from __future__ import annotations

from pathlib import Path

import redis
from pymilvus import MilvusClient
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from ragcache.embedded_redis import EmbeddedRedis
from ragcache.errors import ConfigError
from ragcache.redis_client import open_redis
from ragcache.settings import Settings

__all__ = ["Stores", "open_milvus"]


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


def no_retry_on_timeout() -> Retry:
    """One immediate retry after a connection error (a pooled connection a restarted Redis dropped), none
    after a timeout: redis-py's default (10 retries with back-off) made one call to a stopped Redis take
    ~3.5 s, and a retried timeout doubles the wait; a failing Redis must cost a request one timeout at most."""
    return Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))


class Stores:
    """Shared clients. ``redis`` is None when L2 is off, a ``RedisCluster`` when the URL names a cluster
    (see ``ragcache.redis_client``); ``milvus`` is None when L3 is off."""

    def __init__(self, redis_client: redis.Redis | RedisCluster | None, milvus: MilvusClient | None, embedded: EmbeddedRedis | None = None):
        self.redis = redis_client
        self.milvus = milvus
        self.embedded_redis = embedded

    @classmethod
    def open(cls, settings: Settings) -> "Stores":
        embedded = None
        redis_client = None
        if settings.l2_enabled:
            url = settings.redis_url
            if url is None:
                embedded = EmbeddedRedis(settings.data_dir / "redis")
                url = embedded.url
            redis_client = open_redis(url, timeout_s=settings.redis_timeout_s, retry=no_retry_on_timeout())
        uri = settings.resolved_milvus_uri
        milvus = open_milvus(uri) if uri else None
        return cls(redis_client, milvus, embedded)

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()
        if self.milvus is not None:
            self.milvus.close()
        if self.embedded_redis is not None:
            self.embedded_redis.stop()
