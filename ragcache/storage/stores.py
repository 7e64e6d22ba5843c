"""The connections a process opens once and shares: the host's disk store (the disk level, every model's), Redis
or a Redis Cluster (L2, the prefix registry, search results) and Milvus (L3 and the knowledge base), plus the
embedded Redis server when no URL is configured.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import redis
from pymilvus import MilvusClient
from redis.cluster import RedisCluster

from ragcache.errors import ConfigError, TierUnavailableError
from ragcache.observe.redact import redact_text, redact_url
from ragcache.observe.tracing import Tracing
from ragcache.settings import Levels, Settings
from ragcache.storage.data_folder import DataFolderLock, hold_data_folder
from ragcache.storage.disk_files import free_bytes
from ragcache.storage.disk_store import DiskStore
from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache.storage.milvus_errors import milvus_failures
from ragcache.storage.redis_client import open_redis
from ragcache.storage.supervision import shared_restarts

__all__ = ["MilvusConnection", "Stores", "connect_milvus", "open_milvus"]

log = logging.getLogger(__name__)


# Methods of MilvusClient that only build a local object: every other method talks to Milvus and gets a deadline.
_LOCAL_METHODS = frozenset({"create_schema", "prepare_index_params", "close"})
DEFAULT_MILVUS_TIMEOUT_S: float = Levels.model_fields["milvus_timeout_s"].default


class MilvusConnection:
    """A Milvus client whose every call has a deadline, and which may start while a server is down.

    Deadline: pymilvus waits without limit unless each call passes ``timeout=`` (a paused server, SIGSTOP,
    held a request for minutes). Every method that reaches Milvus gets ``timeout=timeout_s`` here, so no
    caller can forget it; a call past it raises grpc's DEADLINE_EXCEEDED, which L3 and the knowledge base
    count as an outage like a refused connection. Milvus Lite opened from a ``.db`` file runs the same gRPC
    server in a child process (over a local socket), and the deadline holds there too.

    Late start: pymilvus connects when a ``MilvusClient`` is made, so a server down at start-up would stop
    the service, where a server that goes down later only makes L3 and the knowledge base fail (a miss, or a
    503). For a server (``lazy=True``) every use first makes sure a client exists; while none can be made,
    the use raises ``TierUnavailableError``. Milvus Lite is opened at once: failing to open a local file is
    a configuration error, to report at once.

    Credentials come apart from the URI (``user``/``password`` or ``token``) and are never shown; the URI
    itself is only ever shown redacted.
    """

    def __init__(self, uri: str, *, timeout_s: float = DEFAULT_MILVUS_TIMEOUT_S, user: str | None = None,
                 password: str | None = None, token: str | None = None, lazy: bool = False,
                 client_factory: Callable[..., MilvusClient] = MilvusClient):
        self.uri = uri
        self.timeout_s = timeout_s
        self._credentials = {"user": user or "", "password": password or "", "token": token or ""}
        self._client_factory = client_factory
        self._client: MilvusClient | None = None
        self._closed = False
        self._lock = threading.Lock()
        if not lazy:
            self._connected()
            return
        try:
            self._connected()
        except TierUnavailableError as exc:
            log.warning("%s; starting without it: L3 misses and the knowledge base answers 503 until it is back", exc)

    def __repr__(self) -> str:
        return f"MilvusConnection({redact_url(self.uri)!r}, timeout_s={self.timeout_s})"

    def _connected(self) -> MilvusClient:
        with self._lock:
            if self._client is None:
                self._client = self._open()
            return self._client

    def _open(self) -> MilvusClient:
        shown = redact_url(self.uri)
        try:
            client = self._client_factory(self.uri, timeout=self.timeout_s, **self._credentials, **_grpc_options_for(self.uri))
        except milvus_failures as exc:
            message = redact_text(str(exc), self.uri, *self._credentials.values())
            raise TierUnavailableError("Milvus", f"cannot reach the server at {shown}: {message}") from exc
        if self.uri.endswith(".db"):
            _use_milvus_lite(self.uri)
        return client

    def __getattr__(self, name: str):
        method = getattr(self._connected(), name)
        if name in _LOCAL_METHODS or name.startswith("_") or not callable(method):
            return method
        return functools.partial(_with_deadline, method, self.timeout_s)

    def close(self) -> None:
        """Close the client; later calls fail as pymilvus fails on a closed client (they do not reconnect). For a
        Milvus Lite file, the last connection of this process to it also stops its ``milvus`` server process."""
        with self._lock:
            if self._client is not None and not self._closed:
                self._client.close()
                self._closed = True
                if self.uri.endswith(".db"):
                    _release_milvus_lite(self.uri)


# pymilvus pings its server every 10 s even when idle (gRPC keepalive), which a server may answer with GOAWAY
# "too_many_pings" and a logged error. To Milvus Lite (a .db file's child process, or our MilvusLiteServer on a unix
# socket) the pings find out nothing that its exit would not: off there; a remote server keeps pymilvus' defaults.
_LOCAL_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": False}


def _grpc_options_for(uri: str) -> dict:
    return {"grpc_options": dict(_LOCAL_GRPC_OPTIONS)} if uri.endswith(".db") or uri.startswith("unix:") else {}


# Milvus Lite (a .db path): pymilvus starts one `milvus` server process per database path and keeps it until this
# Python process exits, whatever is closed (milvus_lite.server_manager): three caches opened and closed on three
# paths left three servers, up to GBs each. The connections of this process to each path are counted here, and
# the last one to close releases its server (release_server stops it and removes its socket and lock file).
_lite_users: dict[Path, int] = {}
_lite_users_lock = threading.Lock()


def _use_milvus_lite(uri: str) -> None:
    path = Path(uri).absolute().resolve()
    with _lite_users_lock:
        _lite_users[path] = _lite_users.get(path, 0) + 1


def _release_milvus_lite(uri: str) -> None:
    from milvus_lite.server_manager import server_manager_instance

    path = Path(uri).absolute().resolve()
    with _lite_users_lock:
        num_users = _lite_users.get(path, 0) - 1
        if num_users > 0:
            _lite_users[path] = num_users
            return
        _lite_users.pop(path, None)
        server_manager_instance.release_server(str(path))


def _with_deadline(method: Callable, timeout_s: float, *args, **kwargs):
    kwargs.setdefault("timeout", timeout_s)
    return method(*args, **kwargs)


def open_milvus(uri: str, *, timeout_s: float = DEFAULT_MILVUS_TIMEOUT_S, **credentials) -> MilvusConnection:
    """Milvus Lite for a path ending in ``.db`` (opened now: an error is a ``ConfigError``), a server for
    ``http(s)://`` (connected on first use); every call with a deadline of ``timeout_s``."""
    if uri.endswith(".db"):
        Path(uri).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            connection = MilvusConnection(uri, timeout_s=timeout_s)
        except Exception as exc:  # noqa: BLE001 - at start-up, milvus_lite raises several unrelated types for a file it cannot open
            raise ConfigError(f"cannot open Milvus at {uri}: {exc}") from exc
        _make_private(Path(uri))
        return connection
    if uri.startswith("unix:"):
        # The shared Milvus Lite server of `ragcache serve --workers N` (ragcache.storage.embedded_milvus).
        return MilvusConnection(uri, timeout_s=timeout_s, lazy=True, **credentials)
    if not uri.startswith(("http://", "https://", "tcp://")):
        raise ConfigError(f"milvus_uri {redact_url(uri)!r}: use a path ending in .db (Milvus Lite), http://host:port "
                          "or unix:/path/to/socket")
    return MilvusConnection(uri, timeout_s=timeout_s, lazy=True, **credentials)


def _make_private(path: Path) -> None:
    """Milvus Lite creates its file (and pymilvus its lock file beside it) as the umask says, 0644 under a plain
    shell: closed to 0600 here."""
    for created in (path, path.parent / f".{path.name}.lock"):
        try:
            created.chmod(0o600)
        except OSError:
            pass  # not created (yet): the folder's 0700 keeps it private anyway


def connect_milvus(settings: Settings) -> MilvusConnection | None:
    """The Milvus of ``settings`` (None when L3 is off), with its deadline and credentials."""
    uri = settings.levels.resolved_milvus_uri
    if uri is None:
        return None
    return open_milvus(uri, timeout_s=settings.levels.milvus_timeout_s, user=settings.levels.milvus_user,
                       password=settings.levels.milvus_password, token=settings.levels.milvus_token)


def milvus_free_bytes(settings: Settings) -> Callable[[], int] | None:
    """The free bytes of the volume that holds an embedded Milvus Lite's file (the ``.db`` path's folder; the data
    folder for the shared server of ``--workers``, ``unix:``), read at each call; None for a Milvus server (its volume
    is not this host's) or without L3."""
    uri = settings.levels.resolved_milvus_uri
    if uri is None:
        return None
    if uri.endswith(".db"):
        folder = Path(uri).parent
    elif uri.startswith("unix:"):
        folder = settings.levels.data_dir
    else:
        return None
    return lambda: free_bytes(folder)


class Stores:
    """Shared clients. ``redis`` is None when L2 is off, a ``RedisCluster`` when the URL names a cluster
    (see ``ragcache.storage.redis_client``); ``milvus`` is None when L3 is off; ``disk`` None without a disk level."""

    def __init__(
        self,
        redis_client: redis.Redis | RedisCluster | None,
        milvus: MilvusConnection | MilvusClient | None,
        embedded: EmbeddedRedis | None = None,
        tracing: Tracing | None = None,
        *,
        disk: DiskStore | None = None,
        folder_lock: DataFolderLock | None = None,
    ):
        self.redis = redis_client
        self.milvus = milvus
        self.embedded_redis = embedded
        self.tracing = tracing if tracing is not None else Tracing()
        self.disk = disk
        self.folder_lock = folder_lock
        self._data_dir = folder_lock.path if folder_lock is not None else None

    @classmethod
    def open(cls, settings: Settings) -> Stores:
        """The stores of ``settings``, the embedded Redis started when no URL is configured. Whatever this started is
        stopped again when a later part fails; a data folder another process holds is ``DataFolderInUseError``
        before anything starts on its files."""
        # First: a missing SDK stops the start before anything opens.
        tracing = Tracing.configured(settings.service.tracing, settings.service.tracing_endpoint)
        opened = cls(None, None, tracing=tracing, folder_lock=_hold_if_embedded(settings))
        opened._data_dir = settings.levels.data_dir  # where a parent `ragcache serve --workers N` publishes its restarts
        try:
            opened._open_parts(settings)
        except BaseException:
            opened.close()
            raise
        return opened

    def _open_parts(self, settings: Settings) -> None:
        # Before any server starts: a budget too small for its generations is a configuration error.
        disk_path = settings.levels.resolved_disk_path
        if disk_path is not None:
            self.disk = DiskStore(disk_path, capacity_bytes=settings.levels.disk_max_bytes,
                                  num_generations=settings.levels.disk_generations)
        if settings.levels.l2_enabled:
            url = settings.levels.redis_url
            if url is None:
                self.embedded_redis = EmbeddedRedis(settings.levels.data_dir / "redis", unix_socket=True, supervise=True,
                                                    maxmemory=str(settings.levels.embedded_redis_max_bytes))
                if settings.levels.redis_ttl_s is None:
                    log.warning("redis_ttl_s is unset: L2 entries have no TTL, so the embedded Redis (volatile-lru) "
                                "cannot evict them, and L2 writes fail once it holds embedded_redis_max_bytes")
                url = self.embedded_redis.url
            self.redis = open_redis(url, timeout_s=settings.levels.redis_timeout_s)
        self.milvus = connect_milvus(settings)

    def server_restarts(self) -> dict[str, int]:
        """How often each embedded server this process supervises was restarted after it died (``EmbeddedRedis``;
        under ``ragcache serve --workers N`` the shared servers' counts, ``ragcache.storage.supervision``)."""
        restarts = shared_restarts(self._data_dir) if self._data_dir is not None else {}
        if self.embedded_redis is not None:
            restarts["redis"] = self.embedded_redis.num_restarts
        return restarts

    def close(self) -> None:
        self.tracing.shutdown()
        if self.disk is not None:
            self.disk.close()
        if self.redis is not None:
            self.redis.close()
        if self.milvus is not None:
            self.milvus.close()
        if self.embedded_redis is not None:
            self.embedded_redis.stop()
        if self.folder_lock is not None:
            self.folder_lock.release()
            self.folder_lock = None


def _hold_if_embedded(settings: Settings) -> DataFolderLock | None:
    """The data folder's lock when these stores start a server on its files (the embedded Redis, Milvus Lite): a
    service on the same folder refuses this process before either starts (``ragcache.storage.data_folder``)."""
    levels = settings.levels
    milvus_uri = levels.resolved_milvus_uri
    if (levels.l2_enabled and levels.redis_url is None) or (milvus_uri is not None and milvus_uri.endswith(".db")):
        return hold_data_folder(levels.data_dir)
    return None
