"""Opening Redis: one server or a Redis Cluster, told apart by asking the server.

``RAGCACHE_REDIS_URL`` may name any node of a cluster, or list seed nodes separated by commas; either way
the result is a ``redis.cluster.RedisCluster`` when the server says ``cluster_enabled:1`` (INFO cluster), else
a plain ``redis.Redis``. Both answer the same single-key commands and pipelines, so the code that uses
Redis (L2, the search result cache, the prefix registry, the single-flight locks) takes either. L2 sends
its batches on a cluster through ``ragcache.storage.cluster_pipeline``: one round trip per node, not one per key.

A cluster client raises ``RedisClusterException`` (not a ``RedisError``) when no node covers a slot or
none can be reached; ``REDIS_ERRORS`` names both so that callers turn either into a miss.
"""

from __future__ import annotations

import inspect
import logging

import redis
import redis.asyncio
import redis.asyncio.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.exceptions import ClusterDownError, RedisClusterException, SlotNotCoveredError
from redis.retry import Retry

from ragcache.errors import ConfigError
from ragcache.observe.redact import redact_text, redact_url

__all__ = ["REDIS_ERRORS", "open_redis", "asyncio_twin", "is_cluster", "split_urls"]

log = logging.getLogger(__name__)

REDIS_ERRORS = (redis.RedisError, RedisClusterException)

# How often a cluster client re-reads the slot map and tries a command again after a refused connection or
# CLUSTERDOWN (MOVED and ASK are followed apart from these). redis-py does not sleep between tries, so more
# would not outlast a failover (seconds); one lets the first command after a failover reach the promoted
# replica, since the refused try refreshed the slot map.
CLUSTER_RETRIES = 1


class _RedisCluster(RedisCluster):
    """Retries what fails fast, not a timeout: a hung node costs a command one timeout, as it does a single
    server (``_single_server_retry``). redis-py matches these by exact type."""

    ERRORS_ALLOW_RETRY = (redis.ConnectionError, ClusterDownError, SlotNotCoveredError)  # type: ignore[assignment]


def split_urls(url: str) -> list[str]:
    """The seed URLs of a comma-separated list (one URL is a list of one)."""
    return [part.strip() for part in url.split(",") if part.strip()]


def open_redis(url: str, *, timeout_s: float, connection_class: type[redis.Connection] | None = None) -> redis.Redis | RedisCluster:
    """A client for ``url``: a cluster client when the server runs in cluster mode or several seeds are
    given, else a plain client. ``timeout_s`` bounds every socket read and connect, and neither kind retries
    a timeout; ``connection_class`` replaces redis-py's (tests pass one that counts round trips)."""
    seeds = split_urls(url)
    options: dict = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if connection_class is not None:
        options["connection_class"] = connection_class
    if len(seeds) == 1 and not _probe_cluster(seeds[0], options):
        return redis.Redis.from_url(seeds[0], health_check_interval=30, retry=_single_server_retry(), **options)
    return _open_cluster(seeds, options)


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)


def asyncio_twin(client: redis.Redis | RedisCluster) -> redis.asyncio.Redis | redis.asyncio.RedisCluster:
    """An asyncio client for the same server or cluster, with the blocking client's options (those the
    asyncio client knows), and no retries: its callers fall back to the blocking path, which has them.
    Create it inside the event loop that will use it."""
    no_retry = AsyncRetry(NoBackoff(), 0)
    if is_cluster(client):
        node_options = client.get_nodes()[0].redis_connection.connection_pool.connection_kwargs  # type: ignore[union-attr]
        accepted = set(inspect.signature(redis.asyncio.RedisCluster.__init__).parameters) - {"host", "port", "retry"}
        options = {k: v for k, v in node_options.items() if k in accepted}
        # The blocking client learns TLS from its connection class; the asyncio one takes a flag.
        options["ssl"] = issubclass(node_options.get("connection_class", redis.Connection), redis.SSLConnection)
        nodes = [redis.asyncio.cluster.ClusterNode(node.host, node.port) for node in client.get_nodes()]  # type: ignore[union-attr]
        return redis.asyncio.RedisCluster(startup_nodes=nodes, retry=no_retry, **options)
    accepted = set(inspect.signature(redis.asyncio.Redis.__init__).parameters) - {"retry"}
    kwargs = client.connection_pool.connection_kwargs  # type: ignore[union-attr]
    options = {k: v for k, v in kwargs.items() if k in accepted}
    if "path" in kwargs:  # a unix socket (the embedded Redis): the asyncio client names it otherwise
        options["unix_socket_path"] = kwargs["path"]
    return redis.asyncio.Redis(retry=no_retry, **options)


def _probe_cluster(url: str, options: dict) -> bool:
    """Whether the server at ``url`` runs in cluster mode. A server that cannot be asked now is taken as a
    single server (L2 then waits for it like any Redis that is down); give a seed list to insist on a cluster."""
    probe = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options)
    try:
        return bool(probe.info("cluster").get("cluster_enabled"))
    except redis.RedisError as exc:
        log.warning("Redis at %s did not answer (%s): treating it as a single server, not a cluster",
                    redact_url(url), redact_text(str(exc), url))
        return False
    finally:
        probe.close()


def _single_server_retry() -> Retry:
    """One immediate retry after a connection error (a pooled connection a restarted Redis dropped), none
    after a timeout: redis-py's default (10 retries with back-off) made one call to a stopped Redis take
    ~3.5 s, and a retried timeout doubles the wait; a failing Redis must cost a request one timeout at most."""
    return Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))


def _cluster_retry() -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), CLUSTER_RETRIES)


def _open_cluster(seeds: list[str], options: dict) -> RedisCluster:
    first, *others = seeds
    try:
        startup_nodes = [ClusterNode(parsed["host"], parsed.get("port", 6379)) for parsed in map(parse_url, others)]
        # The first seed carries the options every node shares (user, password, TLS); the others add addresses.
        return _RedisCluster(url=first, startup_nodes=startup_nodes, retry=_cluster_retry(), **options)
    except (KeyError, ValueError) as exc:
        shown = redact_url(",".join(seeds))
        raise ConfigError(f"redis_url {shown!r}: a cluster seed must be redis://host:port or rediss://host:port") from exc
    except REDIS_ERRORS as exc:
        shown = redact_url(",".join(seeds))
        raise ConfigError(f"cannot reach the Redis Cluster at any of {shown}: {redact_text(str(exc), *seeds)}") from exc
