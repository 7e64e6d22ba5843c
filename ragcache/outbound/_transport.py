"""The transport under every outbound client: each socket operation waits at most until the call's deadline.

httpx's timeouts bound one operation each (a connect, one read), so an upstream that sends its headers or its
answer a byte at a time holds a call for as long as it likes. Here the deadline of the call in progress (a
context variable, set by ``Upstream`` around each attempt in the thread that makes it) clamps the timeout of
every connect, TLS handshake, read and write on the connection, so no phase of the call outlives it.
"""

from __future__ import annotations

import contextvars
import ssl
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

__all__ = ["DeadlineTransport", "deadline_of_call"]

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("ragcache_outbound_deadline", default=None)


@contextmanager
def deadline_of_call(seconds_left: float) -> Iterator[None]:
    """Inside, every socket operation of this thread's calls ends ``seconds_left`` from now at the latest."""
    token = _DEADLINE.set(time.monotonic() + seconds_left)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _clamped(timeout: float | None) -> float | None:
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise httpcore.ReadTimeout("the call's deadline passed")
    return remaining if timeout is None else min(timeout, remaining)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _clamped(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _clamped(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, _clamped(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(host, port, _clamped(timeout), local_address, socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._backend.connect_unix_socket(path, _clamped(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class DeadlineTransport(httpx.BaseTransport):
    """httpx's HTTP/1.1 transport over a connection pool whose sockets keep the call's deadline. No proxy, no
    environment: the key goes to the configured host only."""

    def __init__(self, max_connections: int):
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            network_backend=_DeadlineBackend(),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, Iterable)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors(request):
            answer = self._pool.handle_request(core_request)
        return httpx.Response(status_code=answer.status, headers=answer.headers, stream=_Body(answer, request),
                              extensions=answer.extensions)

    def close(self) -> None:
        self._pool.close()


class _Body(httpx.SyncByteStream):
    def __init__(self, answer: httpcore.Response, request: httpx.Request):
        self._answer, self._request = answer, request

    def __iter__(self) -> Iterator[bytes]:
        assert isinstance(self._answer.stream, Iterable)
        with _as_httpx_errors(self._request):
            yield from self._answer.stream

    def close(self) -> None:
        self._answer.close()


@contextmanager
def _as_httpx_errors(request: httpx.Request) -> Iterator[None]:
    """httpcore's exceptions as httpx's, so callers handle one family (what httpx's own transport does)."""
    try:
        yield
    except httpcore.ConnectTimeout as exc:
        raise httpx.ConnectTimeout(str(exc), request=request) from exc
    except httpcore.TimeoutException as exc:
        raise httpx.ReadTimeout(str(exc), request=request) from exc
    except httpcore.ConnectError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, httpcore.ProxyError) as exc:
        raise httpx.ReadError(str(exc), request=request) from exc
