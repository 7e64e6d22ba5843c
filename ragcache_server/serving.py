"""The server under ``ragcache serve``: uvicorn (httptools, uvloop) with a header deadline, a send deadline and a
connection bound.

uvicorn's own settings bound idle keep-alive connections only: a connection that sends nothing, or trickles its
request headers a byte at a time, was never closed (each byte cancels the keep-alive timer), so a few hundred such
sockets used up the process's descriptors and every other client was refused (docs/SECURITY.md, "slow clients").
``GuardedHttpToolsProtocol`` adds what the server itself must do, whatever sits in front of it:

- **a header deadline**: from a connection's first moment, and from the first byte of each later request on it,
  the request line and headers must be in within ``header_timeout_s``, or the connection is closed; a body has its
  own deadline (``body_timeout_s``, ``LimitsMiddleware``), and a request being answered has none of these;
- **a send deadline**: an answer whose bytes back up in the connection's write buffer (the client reads slowly or not
  at all) must drain within ``send_timeout_s``, or the connection is dropped with what it still held. Without it 20
  clients that asked for ~8 MB answers and read nothing held +165 MiB for as long as they liked: uvicorn finishes
  the request with the answer still buffered, and its keep-alive close waits for a flush that never comes;
- **a connection bound**: a connection beyond ``max_connections`` open ones is closed as it is accepted, before
  it holds anything but a moment of one descriptor (uvicorn's ``limit_concurrency``, which this also sets, only
  answers 503 to requests past it once their headers are in).

Graceful drain is uvicorn's: SIGTERM stops accepting, lets requests in flight finish (``timeout_graceful_shutdown``),
then runs the lifespan's shutdown (queued L2/L3 writes flushed).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.supervisors import Multiprocess

__all__ = ["GuardedHttpToolsProtocol", "ServeConfig", "bounds_of", "max_connections_of", "proxy_options", "run_server"]

log = logging.getLogger("uvicorn.error")


class ServeConfig(uvicorn.Config):
    """uvicorn's settings plus the header deadline; ``max_connections`` becomes its ``limit_concurrency``. The
    config is what uvicorn hands each worker process, so the protocol reads its bounds from it."""

    def __init__(self, app: Any, *, header_timeout_s: float, max_connections: int, send_timeout_s: float = 30.0,
                 **options: Any):
        super().__init__(app, http=GuardedHttpToolsProtocol, limit_concurrency=max_connections, **options)
        self.header_timeout_s = header_timeout_s
        self.send_timeout_s = send_timeout_s
        self.max_connections = max_connections


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline and the connection bound (the module docstring)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)
        # A plain uvicorn.Config (a test's, a benchmark's) gets the defaults of the settings.
        self._header_timeout_s: float = getattr(config, "header_timeout_s", 10.0)
        self._max_connections: int | None = getattr(config, "max_connections", None)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._num_headers_done = 0  # requests whose headers are in, on this connection
        self._send_timeout_s: float = getattr(config, "send_timeout_s", 30.0)
        self._send_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self._max_connections is not None and len(self.connections) >= self._max_connections:
            # Closed before it is counted or parsed: connection_lost below still finds a transport to close.
            self.transport = transport
            transport.close()
            log.warning("a connection over the bound of %d open ones was closed (RAGCACHE_MAX_CONNECTIONS)", self._max_connections)
            return
        super().connection_made(transport)
        # A low-water mark of 0: resume_writing then means the buffered answer is out, which is what the send
        # deadline waits for (the default, a quarter of the high mark, would let a client that reads a little and
        # stops reset it again and again). Only an answer over the high mark (64 KiB) ever pauses.
        _, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=high, low=0)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        # Bytes between requests (the next one starting): its headers get their deadline from the first byte. Armed
        # only when this chunk did not complete them (the common case does: no timer made and cancelled a request).
        between = self._header_deadline is None and (self.cycle is None or self.cycle.response_complete)
        num_headers_done = self._num_headers_done
        super().data_received(data)
        if between and self._num_headers_done == num_headers_done and not self.transport.is_closing():
            self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self._num_headers_done += 1
        self._disarm_header_deadline()
        super().on_headers_complete()

    def pause_writing(self) -> None:
        if self._send_deadline is None:
            self._send_deadline = self.loop.call_later(self._send_timeout_s, self._sent_too_late)
        super().pause_writing()

    def resume_writing(self) -> None:
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None
        if self.flow is None:  # closed over the bound in connection_made: nothing else was set up
            return
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self._header_timeout_s, self._headers_too_late)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_late(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _sent_too_late(self) -> None:
        # abort, not close: close would wait for the buffer to flush to a client that does not read it.
        self._send_deadline = None
        log.warning("a connection whose answer did not drain within %g s was closed (RAGCACHE_SEND_TIMEOUT_S)",
                    self._send_timeout_s)
        self.transport.abort()


# Descriptors kept for everything but client connections: the stores' sockets, the model's and Milvus Lite's files,
# logs, worker threads' pipes.
RESERVED_DESCRIPTORS = 128
MAX_AUTO_CONNECTIONS = 4096


def max_connections_of(configured: int) -> int:
    """``RAGCACHE_MAX_CONNECTIONS``, or for 0 the process's descriptor limit less what the service itself needs: a
    bound below the limit is what keeps the last descriptors for the stores and for ``/health``."""
    if configured:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = MAX_AUTO_CONNECTIONS if soft == resource.RLIM_INFINITY else soft - RESERVED_DESCRIPTORS
    return max(16, min(MAX_AUTO_CONNECTIONS, limit))


def bounds_of(service: Any, access: Any = None) -> dict[str, Any]:
    """The server's bounds from the settings' ``service`` section, as ``ServeConfig`` takes them; with ``access``,
    also whose X-Forwarded-For is believed (``proxy_options``)."""
    bounds = {"header_timeout_s": service.header_timeout_s, "send_timeout_s": service.send_timeout_s,
              "max_connections": max_connections_of(service.max_connections)}
    return bounds if access is None else {**bounds, **proxy_options(access.trusted_proxies)}


def proxy_options(trusted_proxies: list[str]) -> dict[str, Any]:
    """uvicorn's forwarded-header options: believed only from the listed proxies. uvicorn's own default believes
    X-Forwarded-For from 127.0.0.1, so any local process could send a forged one and be counted as another client
    (a fresh failed-key budget per request); with no proxy listed, the connection's own address counts."""
    if not trusted_proxies:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": list(trusted_proxies)}


def run_server(config: ServeConfig, sock: socket.socket | None = None) -> None:
    """What ``uvicorn.run`` does with a config, for one worker or several (each gets ``config``, bounds and all), on
    ``sock`` when the caller bound it already (``ragcache serve`` binds before it starts anything: a port in use is
    then one line, not a start undone; ``ragcache_server.startup``)."""
    server = uvicorn.Server(config)
    if config.workers > 1:
        Multiprocess(config, sockets=[sock if sock is not None else config.bind_socket()]).run()
    else:
        server.run(sockets=None if sock is None else [sock])
