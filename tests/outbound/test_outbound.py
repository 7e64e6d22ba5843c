"""The one outbound HTTP helper (``ragcache.outbound.Upstream``) against loopback upstreams that misbehave:
a body or headers that trickle past the deadline, an answer over the byte cap, a redirect, Retry-After, keys
echoed in error bodies, and a caller's own key refused (pass-through)."""

from __future__ import annotations

import email.utils
import socket
import threading
import time

import httpx
import orjson
import pytest

from ragcache.core.health import TierHealth
from ragcache.errors import UpstreamBadResponseError, UpstreamTimeoutError, UpstreamUnavailableError
from ragcache.models.remote import ApiKey
from ragcache.outbound import CallLimits, Upstream, WireTransport, retry_after_s
from tests.models.remote.loopback import LoopbackServer, Received, Reply

SECRET = "sk-outbound-test-0123456789abcdef"
CALLER_SECRET = "sk-caller-test-fedcba9876543210"


def upstream(limits: CallLimits | None = None, **options) -> Upstream:
    options.setdefault("health", TierHealth())
    return Upstream("m", limits or CallLimits(timeout_s=1.0, max_retries=0), api_key=ApiKey(SECRET), **options)


def as_json(body: bytes):
    return orjson.loads(body)


class Plan:
    """Answers with the replies queued in ``replies`` (one per request), then 200 ``{"ok": true}``."""

    def __init__(self, *replies: Reply):
        self.replies = list(replies)

    def __call__(self, request: Received) -> Reply:
        return self.replies.pop(0) if self.replies else Reply(200, {"ok": True})


def test_a_body_trickling_past_the_deadline_is_cut_off_at_it_and_opens_the_breaker():
    # One byte every 0.2 s: no read ever waits long, so only an overall deadline ends the call.
    with LoopbackServer(Plan(Reply(200, b'{"ok": true}' + b" " * 200, drip_s=0.2))) as server:
        client = upstream()
        started = time.monotonic()
        with pytest.raises(UpstreamTimeoutError, match="within 1 s"):
            client.post(server.url, {}, parse=as_json, max_bytes=1 << 20)
        assert time.monotonic() - started < 1.6
        assert client.health is not None and client.health.is_down  # a timeout opens the breaker like a refusal
        started = time.monotonic()
        with pytest.raises(UpstreamUnavailableError, match="skipped"):
            client.post(server.url, {}, parse=as_json, max_bytes=1 << 20)
        assert time.monotonic() - started < 0.05 and len(server.received) == 1  # refused without a request
        client.close()


def test_headers_trickling_past_the_deadline_are_cut_off_at_it():
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip_headers() -> None:
        connection, _ = listener.accept()
        connection.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100:
            if stop.wait(0.2):
                break
            connection.sendall(bytes([byte]))
        connection.close()

    threading.Thread(target=drip_headers, daemon=True).start()
    client = upstream()
    started = time.monotonic()
    try:
        with pytest.raises(UpstreamTimeoutError):
            client.post(f"http://127.0.0.1:{listener.getsockname()[1]}/", {}, parse=as_json, max_bytes=1 << 20)
        assert time.monotonic() - started < 1.6
    finally:
        stop.set()
        listener.close()
        client.close()


def test_an_answer_over_the_byte_cap_is_refused_without_reading_it_whole():
    huge = b'{"pad": "' + b"x" * (8 << 20) + b'"}'
    with LoopbackServer(Plan(Reply(200, huge))) as server:
        client = upstream()
        with pytest.raises(UpstreamBadResponseError, match="over 65536 bytes"):
            client.post(server.url, {}, parse=as_json, max_bytes=64 * 1024)
        assert client.health is not None and client.health.is_down
        client.close()


def test_a_redirect_is_not_followed_so_the_key_stays_with_the_configured_host():
    with LoopbackServer(Plan()) as elsewhere, LoopbackServer(Plan(Reply(307, b"", headers={"Location": elsewhere.url}))) as server:
        client = upstream()
        with pytest.raises(UpstreamBadResponseError, match="answered 307"):
            client.post(server.url, {}, parse=as_json, max_bytes=1024)
        assert not elsewhere.received and server.received[0].headers["authorization"] == f"Bearer {SECRET}"
        client.close()


def test_429_is_retried_after_its_retry_after():
    waits: list[float] = []
    with LoopbackServer(Plan(Reply(429, {"error": "slow down"}, headers={"Retry-After": "0.25"}))) as server:
        client = upstream(CallLimits(timeout_s=5.0, max_retries=2), sleep=waits.append)
        assert client.post(server.url, {}, parse=as_json, max_bytes=1024) == {"ok": True}
        assert waits == [0.25] and len(server.received) == 2
        client.close()


def test_retry_after_is_read_in_seconds_or_as_an_http_date():
    assert retry_after_s(httpx.Headers({"Retry-After": "2.5"})) == 2.5
    assert retry_after_s(httpx.Headers({"Retry-After": "-3"})) == 0.0
    in_ten_s = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8 <= (retry_after_s(httpx.Headers({"Retry-After": in_ten_s})) or 0) <= 10
    assert retry_after_s(httpx.Headers({"Retry-After": "soon"})) is None
    assert retry_after_s(httpx.Headers({"Retry-After": "nan"})) is None
    assert retry_after_s(httpx.Headers({})) is None


@pytest.mark.parametrize("status", [401, 403])
def test_a_credentials_refusal_is_never_quoted(status):
    echo = {"error": {"message": f"Incorrect API key provided: {SECRET}"}}
    with LoopbackServer(Plan(Reply(status, echo))) as server:
        client = upstream()
        with pytest.raises(UpstreamBadResponseError) as raised:
            client.post(server.url, {}, parse=as_json, max_bytes=1024)
        assert "refused the credentials" in str(raised.value) and "Incorrect" not in str(raised.value)
        assert SECRET not in str(client.health.last_error if client.health else "")
        client.close()


def test_other_error_bodies_are_quoted_short_with_keys_and_url_credentials_masked(caplog):
    # Each body echoes every secret its request carried: the model's key or the caller's, and the URL's password.
    body = f"no such route; key {SECRET}, caller {CALLER_SECRET}, url password pw-in-url".encode()
    messages = []
    for status, caller_key in ((404, None), (422, ApiKey(CALLER_SECRET))):
        echoed = body if caller_key else body.replace(CALLER_SECRET.encode(), b"-")
        with LoopbackServer(Plan(Reply(status, echoed))) as server:
            client = upstream()
            url = server.url.replace("http://", "http://user:pw-in-url@")
            with pytest.raises(UpstreamBadResponseError) as raised:
                client.post(url, {}, parse=as_json, max_bytes=1024, caller_key=caller_key)
            messages += [str(raised.value), str(client.health.last_error if client.health else "")]
            client.close()
    assert "answered 404: no such route" in messages[0] and "answered 422 for the caller's own key" in messages[2]
    assert raised.value.per_text  # a 422 is about the texts: the batcher isolates them
    for secret in (SECRET, CALLER_SECRET, "pw-in-url"):
        assert not any(secret in text for text in (*messages, caplog.text)), secret


def test_a_key_that_straddles_the_excerpts_cut_is_masked_whole_before_the_cut():
    # The key starts 10 bytes before byte 200: cut first and masked after, "Bearer sk-outbou" was shown.
    for caller_key, secret in ((None, SECRET), (ApiKey(CALLER_SECRET), CALLER_SECRET)):
        body = b"e" * 183 + b" Bearer " + secret.encode() + b" and more after it"
        assert body.index(secret.encode()) < 200 < body.index(secret.encode()) + len(secret)
        with LoopbackServer(Plan(Reply(404 if caller_key is None else 422, body))) as server:
            client = upstream()
            with pytest.raises(UpstreamBadResponseError) as raised:
                client.post(server.url, {}, parse=as_json, max_bytes=1024, caller_key=caller_key)
            client.close()
        message = str(raised.value)
        excerpt = message.rpartition(": ")[2]
        assert excerpt.startswith("e" * 183) and "****" in excerpt and len(excerpt.encode()) <= 200
        assert secret[:6] not in message, message


def test_a_callers_own_key_refused_or_rate_limited_fails_that_call_only():
    plan = Plan(Reply(429, {"error": {"code": "insufficient_quota"}}), Reply(401, {"error": CALLER_SECRET}))
    with LoopbackServer(plan) as server:
        client = upstream(CallLimits(timeout_s=5.0, max_retries=3))
        with pytest.raises(UpstreamUnavailableError, match="caller's own key"):
            client.post(server.url, {}, parse=as_json, max_bytes=1024, caller_key=ApiKey(CALLER_SECRET))
        assert len(server.received) == 1  # not retried: waiting does not give the caller's key credit
        with pytest.raises(UpstreamBadResponseError, match="caller's own key") as raised:
            client.post(server.url, {}, parse=as_json, max_bytes=1024, caller_key=ApiKey(CALLER_SECRET))
        assert CALLER_SECRET not in str(raised.value)
        assert client.health is not None and not client.health.is_down
        assert client.post(server.url, {}, parse=as_json, max_bytes=1024) == {"ok": True}  # the model's key still served
        assert server.received[-1].headers["authorization"] == f"Bearer {SECRET}"
        client.close()


def test_an_answer_in_an_encoding_not_asked_for_is_never_decompressed():
    import gzip

    bomb = gzip.compress(b"0" * (64 << 20))  # 64 MiB of zeros in about 64 KiB
    with LoopbackServer(Plan(Reply(200, bomb, headers={"Content-Encoding": "gzip"}))) as server:
        client = upstream()
        with pytest.raises(UpstreamBadResponseError, match="not usable"):
            client.post(server.url, {}, parse=as_json, max_bytes=1 << 20)
        assert server.received[0].headers["accept-encoding"] == "identity"
        client.close()


def test_an_answer_parse_refuses_is_a_502_that_opens_the_breaker():
    def refuse(body: bytes):
        raise ValueError(f"not what was asked for: {body.decode()}")

    with LoopbackServer(Plan(Reply(200, {"echo": SECRET}))) as server:
        client = upstream()
        with pytest.raises(UpstreamBadResponseError, match="not usable") as raised:
            client.post(server.url, {}, parse=refuse, max_bytes=1024)
        assert SECRET not in str(raised.value) and client.health is not None and client.health.is_down
        client.close()


def test_calls_reuse_one_kept_alive_connection():
    with LoopbackServer(Plan()) as server:
        client = upstream()
        for _ in range(3):
            assert client.post(server.url, {}, parse=as_json, max_bytes=1024) == {"ok": True}
        client.close()
    assert len({request.peer for request in server.received}) == 1


def test_a_kept_alive_connection_the_upstream_closed_while_idle_is_replaced_and_the_call_served():
    """An upstream that closes each connection after its answer without saying so: the next call finds the pooled
    socket dead before anything is read back and sends the request once more on a fresh one."""
    accepted = []
    listener = socket.create_server(("127.0.0.1", 0))
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"ok\": true}"

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            accepted.append(conn)
            conn.recv(65536)
            conn.sendall(answer)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = upstream()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    assert client.post(url, {}, parse=as_json, max_bytes=1024) == {"ok": True}
    time.sleep(0.05)  # the close reaches the pooled socket before it is used again
    assert client.post(url, {}, parse=as_json, max_bytes=1024) == {"ok": True}
    thread.join(timeout=10)
    client.close()
    listener.close()
    assert len(accepted) == 2 and client.health is not None and not client.health.is_down


def test_a_resolver_that_hangs_costs_a_call_its_deadline_and_opens_the_breaker():
    """The system's getaddrinfo has no timeout: a DNS server that stops answering held a call (and its worker
    thread) for as long as it liked. The name is resolved within the call's deadline, and its timeout is the
    upstream's like any other."""
    released = threading.Event()
    asked: list[str] = []

    def hung_getaddrinfo(host, port, *args):
        asked.append(host)
        released.wait(30)  # a resolver that does not answer (released when the test ends)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    client = upstream(transport=WireTransport(2, getaddrinfo=hung_getaddrinfo))
    try:
        # A timeout at the call's deadline; the old code waited out the resolver and failed with its ConnectError.
        with pytest.raises(UpstreamTimeoutError):
            client.post("http://embeddings.internal.example:8080/v1/embeddings", {}, parse=as_json, max_bytes=1 << 20)
        assert asked == ["embeddings.internal.example"]
        assert client.health is not None and client.health.is_down
    finally:
        released.set()
        client.close()


def test_a_name_resolves_through_the_resolver_to_every_address_in_order():
    seen: list[tuple] = []

    def loopback_getaddrinfo(host, port, *args):
        seen.append((host, port))
        return socket.getaddrinfo("127.0.0.1", port, 0, socket.SOCK_STREAM)

    with LoopbackServer(Plan()) as server:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        client = upstream(transport=WireTransport(2, getaddrinfo=loopback_getaddrinfo))
        try:
            assert client.post(f"http://upstream.example:{port}/", {}, parse=as_json, max_bytes=1 << 20) == {"ok": True}
        finally:
            client.close()
    assert seen == [("upstream.example", port)]
    assert server.received[0].headers.get("host") == f"upstream.example:{port}"


def test_a_proxy_in_the_environment_is_never_used(monkeypatch):
    # A proxy named in the environment would see every request, keys included; the helper connects to the URL's host.
    with LoopbackServer(Plan()) as proxy, LoopbackServer(Plan()) as server:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        client = upstream()
        try:
            assert client.post(server.url, {}, parse=as_json, max_bytes=1 << 20) == {"ok": True}
        finally:
            client.close()
        assert (len(server.received), len(proxy.received)) == (1, 0)


class HeaderFlood:
    """A loopback upstream that answers every request with a status line and then headers without end (``line``
    repeated until ``total`` bytes or until the client hangs up), counting the bytes it got out."""

    def __init__(self, line: bytes, total: int = 64 << 20):
        self.line, self.total, self.sent = line, total, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/"
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        connection.recv(65536)
        block = b"HTTP/1.1 200 OK\r\n" + self.line * (65536 // len(self.line) + 1)
        try:
            while self.sent < self.total:
                connection.sendall(block)
                self.sent += len(block)
                block = self.line * (65536 // len(self.line) + 1)
        except OSError:
            pass  # the client hung up: what the test wants
        finally:
            connection.close()
            self.listener.close()
            self.done.set()


@pytest.mark.parametrize("line", [b"X-Flood: " + b"a" * 100 + b"\r\n", b"X-One-Header: " + b"b" * 4096],
                         ids=["a repeated header", "one header without end"])
def test_a_header_flood_is_refused_at_64_kib_without_reading_it(line):
    """The old transport kept every header (a repeated name joined value by value) until the deadline or the
    flood's end: one /embed against a flood took the service from 1.36 to 2.7 GB."""
    flood = HeaderFlood(line)
    client = upstream(CallLimits(timeout_s=20.0))
    try:
        with pytest.raises(UpstreamBadResponseError, match="over 65536 bytes of headers"):
            client.post(flood.url, {}, parse=as_json, max_bytes=1 << 30)
        assert flood.done.wait(20)
        # Cut off near 64 KiB: what got out is that plus what the kernel's socket buffers took before the close.
        assert flood.sent < 16 << 20
        assert client.health is not None and client.health.is_down  # a flooding upstream is a failing one
    finally:
        client.close()


def test_the_head_counts_inside_a_smaller_byte_cap():
    flood = HeaderFlood(b"X-Flood: " + b"a" * 100 + b"\r\n")
    client = upstream(CallLimits(timeout_s=20.0))
    try:
        with pytest.raises(UpstreamBadResponseError, match="over 4096 bytes of headers"):
            client.post(flood.url, {}, parse=as_json, max_bytes=4096)
    finally:
        client.close()


def test_a_header_flood_through_an_httpx_transport_is_refused_too():
    flood_headers = [(f"x-flood-{index}", "a" * 100) for index in range(1000)]
    transport = httpx.MockTransport(lambda request: httpx.Response(200, headers=flood_headers, content=b"{}"))
    client = upstream(transport=transport)
    with pytest.raises(UpstreamBadResponseError, match="over 65536 bytes of headers"):
        client.post("http://upstream.test/", {}, parse=as_json, max_bytes=1 << 20)
    client.close()


def test_a_repeated_header_name_is_joined_once_in_order():
    listener = socket.create_server(("127.0.0.1", 0))
    values = [f"v{index}" for index in range(500)]
    head = "".join(f"X-Repeated: {value}\r\n" for value in values).encode()
    answer = b"HTTP/1.1 200 OK\r\n" + head + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"

    def serve() -> None:
        connection, _ = listener.accept()
        connection.recv(65536)
        connection.sendall(answer)
        connection.close()

    threading.Thread(target=serve, daemon=True).start()
    transport = WireTransport(1)
    try:
        status, headers, body = transport.exchange("GET", f"http://127.0.0.1:{listener.getsockname()[1]}/", {}, None,
                                                   seconds_left=10.0, max_bytes=1 << 20)
    finally:
        transport.close()
        listener.close()
    assert (status, body) == (200, b"{}")
    assert headers["x-repeated"] == ", ".join(values) and headers["content-length"] == "2"
