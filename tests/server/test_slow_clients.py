"""Slow clients against the real server (issue 27, item 4): a connection that sends nothing, or trickles its headers,
is closed at the header deadline, and connections beyond the bound are closed as they are accepted, so they cannot
use up the descriptors that every other client and the stores need. Before ``ragcache_server/serving.py`` such
sockets were held for ever."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from ragcache.settings import Settings
from tests.live_server import LiveServer

HEADER_TIMEOUT_S = 1.0
# Waits for the server to act are bounded far beyond the deadline: a loaded machine is slow, never wrong.
SAFETY_S = 30.0


def connect(server: LiveServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(SAFETY_S)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (end of stream, or a reset) before ``SAFETY_S``; False when still open."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=tmp_path_factory.mktemp("data"),
                        header_timeout_s=HEADER_TIMEOUT_S, max_connections=64)
    with LiveServer(settings) as live:
        yield live


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(server):
    sock = connect(server)
    assert closed_by_server(sock)
    sock.close()


def test_headers_trickled_a_byte_at_a_time_are_cut_off_at_the_deadline(server):
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " + b"x" * 200 + b"\r\n\r\n"
    sock = connect(server)
    num_sent = 0
    stop = threading.Event()
    # One byte every 0.1 s: the whole request would take 22 s, twenty times the deadline.
    try:
        for byte in request:
            sock.sendall(bytes([byte]))
            num_sent += 1
            if stop.wait(0.1):
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert num_sent < len(request), "the server waited for the whole trickle"
    assert closed_by_server(sock)
    sock.close()


def test_the_next_request_on_a_kept_alive_connection_has_a_header_deadline_too(server):
    sock = connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /health HTTP/1.1\r\nHo")  # and then nothing: the keep-alive timer no longer runs
    assert closed_by_server(sock)
    sock.close()


def test_a_request_that_arrives_in_time_is_served_on_a_guarded_connection(server):
    with httpx.Client(base_url=server.url, timeout=SAFETY_S) as client:
        assert [client.get("/health").status_code for _ in range(3)] == [200, 200, 200]


def test_connections_beyond_the_bound_are_closed_as_they_are_accepted(tmp_path):
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=tmp_path, header_timeout_s=SAFETY_S * 2, max_connections=4)
    with LiveServer(settings) as live:
        held = [connect(live) for _ in range(4)]
        for sock in held:  # each is accepted and held (headers pending, well within their deadline)
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        over = connect(live)
        assert closed_by_server(over)
        over.close()
        for sock in held:
            sock.close()
        # Below the bound again (once the server has seen them close): the service answers.
        assert health_once_below_the_bound(live) == 200


def health_once_below_the_bound(live: LiveServer) -> int:
    for _ in range(int(SAFETY_S / 0.1)):
        try:
            return httpx.get(live.url + "/health", timeout=SAFETY_S).status_code
        except httpx.TransportError:  # closed as over the bound: the server had not yet seen the others go
            threading.Event().wait(0.1)
    raise AssertionError("the service stayed at its connection bound")
