"""The connections a process opens once and shares: Redis (L2, the prefix registry, search results) and
Milvus (L3 and the knowledge base), plus the embedded Redis server when no URL is configured.
"""

from __future__ import annotations

from pathlib import Path

import redis
from pymilvus import MilvusClient

from ragcache.embedded_redis import EmbeddedRedis
from ragcache.errors import ConfigError
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


class Stores:
    """Shared clients. ``redis`` is None when L2 is off; ``milvus`` is None when L3 is off."""

    def __init__(self, redis_client: redis.Redis | None, milvus: MilvusClient | None, embedded: EmbeddedRedis | None = None):
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
            redis_client = redis.Redis.from_url(
                url,
                socket_timeout=settings.redis_timeout_s,
                socket_connect_timeout=settings.redis_timeout_s,
                health_check_interval=30,
            )
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
