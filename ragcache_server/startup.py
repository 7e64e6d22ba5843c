"""What ``ragcache serve`` does before its server starts, in this order, so that a start that cannot work starts nothing:

1. the data folder made private and locked (``ragcache.storage.data_folder``): a second service on the same folder
   stops here, in one line, before any server touches the first one's files;
2. the port bound (``bind_port``): a port in use stops here, in one line; the socket is handed to uvicorn, so no
   other process can take the port between this check and the start;
3. with several workers, the embedded stores they share (``shared_embedded_stores``), supervised.

Whatever an earlier step started is stopped when a later one fails (each is a context manager).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Iterator
from typing import Any

from ragcache import ConfigError
from ragcache.storage import PRIVATE_UMASK, EmbeddedRedis, MilvusLiteServer, hold_data_folder, write_shared_restarts

__all__ = ["PortInUseError", "bind_port", "serve_guard", "shared_embedded_stores"]


class PortInUseError(ConfigError):
    """The service's port is taken (another service, or any other program)."""


def bind_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` as uvicorn binds one (``SO_REUSEADDR``, inheritable for its workers), not yet
    listening; ``PortInUseError`` when another socket listens there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(f"port {port} is in use (on {host}): stop what serves it, or pass --port") from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def serve_guard(settings: Any, host: str, port: int) -> Iterator[socket.socket]:
    """Steps 1 and 2 of the module docstring: the data folder held for ``ragcache serve``, then the port bound; yields
    the bound socket. Also sets this process's umask to 077: everything the service writes (the disk level, Milvus
    Lite's file and socket, the prefix file) is its user's only."""
    os.umask(PRIVATE_UMASK)
    with hold_data_folder(settings.levels.data_dir, role="serve"):
        sock = bind_port(host, port)
        try:
            yield sock
        finally:
            sock.close()


@contextlib.contextmanager
def shared_embedded_stores(settings: Any, workers: int) -> Iterator[None]:
    """With several workers and the embedded defaults, the stores one host shares are started here, once, and
    every worker is pointed at them: one embedded Redis (L2, the prefix registry, single flight between the
    workers) and one Milvus Lite server process, the only process that opens the ``.db`` file and so the one
    L3 writer. Both listen on unix sockets in private folders (Milvus Lite has no authentication: a TCP port would
    let any local user read and drop every collection), both are supervised (restarted when they die), and their
    restart counts are published to the workers (``ragcache.storage.supervision``). The disk level needs nothing:
    its folder is shared by the workers' processes as it is. One worker keeps them in its own process, as before."""
    levels = settings.levels
    embedded_redis = levels.l2_enabled and levels.redis_url is None
    milvus_uri = levels.resolved_milvus_uri
    milvus_lite = milvus_uri is not None and milvus_uri.endswith(".db")
    if workers <= 1 or not (embedded_redis or milvus_lite):
        yield
        return
    restarts = dict.fromkeys((["redis"] if embedded_redis else []) + (["milvus"] if milvus_lite else []), 0)

    def counted(server: str):
        def publish(num_restarts: int) -> None:
            restarts[server] = num_restarts
            write_shared_restarts(levels.data_dir, restarts)
        return publish

    with contextlib.ExitStack() as started:
        write_shared_restarts(levels.data_dir, restarts)  # this run's zeros, over an earlier run's counts
        if embedded_redis:
            redis_server = EmbeddedRedis(levels.data_dir / "redis", maxmemory=str(levels.embedded_redis_max_bytes),
                                         unix_socket=True, supervise=True, on_restart=counted("redis"))
            started.callback(redis_server.stop)
            os.environ["RAGCACHE_REDIS_URL"] = redis_server.url
        if milvus_lite:
            milvus_server = MilvusLiteServer(milvus_uri, unix_socket=True, supervise=True, on_restart=counted("milvus"))
            started.callback(milvus_server.close)
            os.environ["RAGCACHE_MILVUS_URI"] = milvus_server.url
        yield
