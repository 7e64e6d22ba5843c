"""``WireTransport``: HTTP/1.1 on pooled keep-alive sockets with httptools' compiled parser, under every call an
``Upstream`` makes by default.

httpx's request and response models and h11's pure-Python parser cost ~0.4 ms of CPU per 32-text call in front of
a fast upstream, several times the call itself (``ragcache bench http-floor``: a bare client on a raw socket with
httptools costs ~0.06). This transport does only what a call to a configured upstream needs, and keeps what the
outbound helper promises:

- **the call's deadline** bounds every step: resolving the host name (in a small pool of resolver threads: the
  system's ``getaddrinfo`` has no timeout of its own, and a hung DNS server held a call for as long as it liked), the
  connect (also within ``connect_timeout_s``), the TLS handshake, the write and each read get at most the time left,
  so an upstream that trickles its answer a byte at a time is cut off at the deadline, not after each read;
- **the byte cap**: the body is counted as it arrives and the call aborted past ``max_bytes`` (the socket closed);
  the head (status line and headers) counts inside that cap and is bounded on its own too, at ``MAX_HEAD_BYTES``
  (64 KiB, as the old httpx client refused over 16 KiB): an upstream that floods headers is cut off there instead
  of growing the process, and a repeated header name is joined once, when the head is complete (joining value by
  value was quadratic in the flood);
- **no redirect** is followed (a 3xx is an answer like any other, which the helper refuses) and **no proxy**: the
  socket goes to the URL's host and nowhere else, whatever the environment says;
- the answer's bytes are never decoded (``Accept-Encoding: identity`` is sent; a compressed body is not inflated).

Failures are httpx's exception types (``ConnectTimeout``, ``ReadTimeout``, ``ConnectError``, ``ReadError``), so the
helper handles one family whichever transport made the call. A kept-alive socket the upstream closed while idle is
found out on the next use (nothing read back) and the request sent once more on a fresh one, as httpcore does.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools
import httpx

__all__ = ["MAX_HEAD_BYTES", "AnswerTooLarge", "HeadTooLarge", "WireTransport"]

RECV_BYTES = 256 * 1024
# The most bytes of an answer's status line and headers. Real upstreams send well under 2 KiB; nginx's default
# buffers refuse over 8-32 KiB. httptools (llhttp) sets no bound of its own and buffers a header whole.
MAX_HEAD_BYTES = 64 * 1024


class AnswerTooLarge(Exception):
    """The answer (head and body) passed the call's byte cap (the socket is closed, nothing more is read)."""


class HeadTooLarge(AnswerTooLarge):
    """The answer's status line and headers passed ``MAX_HEAD_BYTES`` (the socket is closed)."""


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    host_header: str
    path: str  # path and query, as sent on the request line


@functools.lru_cache(maxsize=256)
def _target_of(url: str) -> _Target:
    split = urlsplit(url)
    if split.scheme not in ("http", "https") or not split.hostname:
        raise httpx.UnsupportedProtocol(f"not an http(s) URL: {split.scheme}://")
    port = split.port or (443 if split.scheme == "https" else 80)
    default = port == (443 if split.scheme == "https" else 80)
    host = split.hostname
    shown_host = f"[{host}]" if ":" in host else host
    path = (split.path or "/") + (f"?{split.query}" if split.query else "")
    return _Target(split.scheme, host, port, shown_host if default else f"{shown_host}:{port}", path)


class _Answer:
    """httptools' callbacks: the status, the headers (lower-cased names) and the body of one answer."""

    def __init__(self, max_bytes: int):
        self.headers: dict[str, str] = {}
        # Values by name until the head is complete, joined once then (joining one at a time is quadratic).
        self._values: dict[str, list[str]] = {}
        self.chunks: list[bytes] = []
        self.size = 0  # head and body bytes so far, against max_bytes
        self.max_head_bytes = min(MAX_HEAD_BYTES, max_bytes)
        self.max_bytes = max_bytes
        self.complete = False
        self.started = False
        self.head_complete = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_message_begin(self) -> None:
        self.started = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.size += len(name) + len(value) + 4  # "name: value\r\n"
        if self.size > self.max_head_bytes:
            raise HeadTooLarge
        self._values.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.head_complete = True
        self.headers = {key: values[0] if len(values) == 1 else ", ".join(values) for key, values in self._values.items()}

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_bytes:
            raise AnswerTooLarge
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        # Only here does the parser still know (llhttp resets it once the message is done).
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()


class WireTransport:
    """A pool of keep-alive sockets per host (at most ``max_connections`` kept idle per host), one exchange at a time
    on each; thread-safe (the helper's slots bound how many calls are in flight)."""

    def __init__(self, max_connections: int, *, connect_timeout_s: float = 5.0,
                 getaddrinfo: Callable[..., list] = socket.getaddrinfo):
        self._max_idle = max_connections
        self._connect_timeout_s = connect_timeout_s
        # ``getaddrinfo``: the system's resolver (a test passes a hung one). Two threads: a resolution is rare (a
        # socket is kept alive), and a resolver that hangs holds at most these while every call times out.
        self._getaddrinfo = getaddrinfo
        self._resolver = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ragcache-resolve")
        self._idle: dict[tuple[str, str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._ssl_context: ssl.SSLContext | None = None
        self._closed = False

    def exchange(self, method: str, url: str, headers: Mapping[str, str], content: bytes | None, *, seconds_left: float,
                 max_bytes: int) -> tuple[int, dict[str, str], bytes]:
        """One request and its answer within ``seconds_left``: (status, headers with lower-cased names, body)."""
        deadline = time.monotonic() + seconds_left  # this clock, whatever clock the caller keeps
        target = _target_of(url)
        head = [f"{method} {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\n"]
        head.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        body = content or b""
        if content is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body)}\r\n")
        # ASCII only: a header value of other characters is refused here (UnicodeEncodeError), never sent mangled.
        request = "".join(head).encode("ascii") + b"\r\n" + body
        sock, reused = self._socket(target, deadline)
        try:
            try:
                answer, keep_alive = self._exchange_on(sock, request, deadline, max_bytes, reused=reused)
            except _StaleConnection:
                sock.close()
                sock = self._connect(target, deadline)
                answer, keep_alive = self._exchange_on(sock, request, deadline, max_bytes, reused=False)
        except BaseException:
            sock.close()
            raise
        if keep_alive:
            self._release(target, sock)
        else:
            sock.close()
        status, answer_headers, answer_body = answer
        return status, answer_headers, answer_body

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for sockets in idle.values():
            for sock in sockets:
                sock.close()
        self._resolver.shutdown(wait=False, cancel_futures=True)

    # ---- sockets ---------------------------------------------------------------------------------------------

    def _socket(self, target: _Target, deadline: float) -> tuple[socket.socket, bool]:
        with self._lock:
            idle = self._idle.get((target.scheme, target.host, target.port))
            if idle:
                return idle.pop(), True
        return self._connect(target, deadline), False

    def _release(self, target: _Target, sock: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault((target.scheme, target.host, target.port), [])
            if not self._closed and len(idle) < self._max_idle:
                idle.append(sock)
                return
        sock.close()

    def _connect(self, target: _Target, deadline: float) -> socket.socket:
        timeout = min(self._connect_timeout_s, _left(deadline, connecting=True))
        addresses = self._resolve(target, timeout)
        for position, address in enumerate(addresses):  # in the resolver's order, as socket.create_connection does
            timeout = min(self._connect_timeout_s, _left(deadline, connecting=True))
            try:
                sock = socket.create_connection((address, target.port), timeout=timeout)
                break
            except TimeoutError as exc:
                raise httpx.ConnectTimeout(f"connecting took over {timeout:.3g} s") from exc
            except OSError as exc:
                if position == len(addresses) - 1:
                    raise httpx.ConnectError(f"{type(exc).__name__}: {exc.strerror or exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if target.scheme == "https":
            try:
                sock.settimeout(_left(deadline, connecting=True))
                sock = self._tls().wrap_socket(sock, server_hostname=target.host)
            except TimeoutError as exc:
                sock.close()
                raise httpx.ConnectTimeout("the TLS handshake passed the call's deadline") from exc
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise httpx.ConnectError(f"TLS: {type(exc).__name__}") from exc
        return sock

    def _resolve(self, target: _Target, timeout: float) -> list[str]:
        """The addresses of ``target``'s host, within ``timeout`` (an IP literal is its own)."""
        try:
            ipaddress.ip_address(target.host)
            return [target.host]
        except ValueError:
            pass
        future = self._resolver.submit(self._getaddrinfo, target.host, target.port, 0, socket.SOCK_STREAM)
        try:
            found = future.result(timeout=timeout)
        except FutureTimeout as exc:
            future.cancel()
            raise httpx.ConnectTimeout(f"resolving {target.host} took over {timeout:.3g} s") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"resolving {target.host}: {type(exc).__name__}: {exc.strerror or exc}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        if not addresses:
            raise httpx.ConnectError(f"resolving {target.host}: no address")
        return addresses

    def _tls(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context()
        return self._ssl_context

    # ---- one exchange ----------------------------------------------------------------------------------------

    def _exchange_on(self, sock: socket.socket, request: bytes, deadline: float, max_bytes: int, *,
                     reused: bool) -> tuple[tuple[int, dict[str, str], bytes], bool]:
        answer = _Answer(max_bytes)
        parser = answer.parser = httptools.HttpResponseParser(answer)
        head_bytes = 0  # bytes fed while the head was incomplete
        try:
            sock.settimeout(_left(deadline))
            sock.sendall(request)
            while not answer.complete:
                sock.settimeout(_left(deadline))
                data = sock.recv(RECV_BYTES)
                if not data:
                    if reused and not answer.started:
                        raise _StaleConnection
                    # The end of a body without a length is the end of the connection.
                    parser.feed_data(b"")
                    if not answer.complete:
                        raise httpx.RemoteProtocolError("the upstream closed the connection mid-answer")
                    break
                parser.feed_data(data)
                if not answer.head_complete:
                    # One header still being buffered by the parser (on_header has not seen it yet) counts too.
                    head_bytes += len(data)
                    if head_bytes > answer.max_head_bytes:
                        raise HeadTooLarge
        except TimeoutError as exc:
            raise httpx.ReadTimeout("the answer passed the call's deadline") from exc
        except (BrokenPipeError, ConnectionResetError) as exc:
            if reused and not answer.started:
                raise _StaleConnection from exc
            raise httpx.ReadError(type(exc).__name__) from exc
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, AnswerTooLarge):
                raise type(exc.__context__) from None
            raise
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"not an HTTP answer: {type(exc).__name__}") from exc
        except OSError as exc:
            raise httpx.ReadError(type(exc).__name__) from exc
        return (parser.get_status_code(), answer.headers, b"".join(answer.chunks)), answer.keep_alive


class _StaleConnection(Exception):
    """A kept-alive socket the upstream had closed: nothing was read back, so the request is sent again."""


def _left(deadline: float, *, connecting: bool = False) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise (httpx.ConnectTimeout if connecting else httpx.ReadTimeout)("the call's deadline passed")
    return remaining
