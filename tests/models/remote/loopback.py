"""A small HTTP server on a free loopback port, in a thread, whose every POST a Python function answers.

The provider tests use it twice: as a wire-format translator (TEI's and Ollama's native routes, answered
by a real model behind Infinity) and as the fault-injecting upstream. It is deliberately plain
(``http.server``): it must be able to hang, cut an answer short, or send anything at all.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ragcache.storage.processes import free_port


@dataclass
class Reply:
    """What to answer: a status, headers, and a body (JSON-encoded unless bytes); ``hang_s`` waits first;
    ``cut`` sends only the first bytes of the body, then closes; ``drip_s`` sends the body a byte at a time,
    this long apart (an upstream that trickles, so that no single read ever times out)."""

    status: int = 200
    body: object = None
    headers: dict[str, str] = field(default_factory=dict)
    hang_s: float = 0.0
    cut: int | None = None
    drip_s: float = 0.0


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: object
    peer: tuple = ()  # the client's address: one per connection, so a test can see a kept-alive one reused


class LoopbackServer:
    def __init__(self, answer: Callable[[Received], Reply]):
        self.answer = answer
        self.received: list[Received] = []
        self._release = threading.Event()  # set at stop: hanging answers end
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - the http.server name
                length = int(self.headers.get("Content-Length", 0))
                request = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(self.rfile.read(length)),
                                   self.client_address)
                server.received.append(request)
                reply = server.answer(request)
                if reply.hang_s:
                    server._release.wait(reply.hang_s)
                body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                for name, value in {"Content-Type": "application/json", **reply.headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                if reply.cut is not None:
                    self.send_header("Connection", "close")
                self.end_headers()
                try:
                    if reply.drip_s:
                        server._drip(self.wfile, body, reply.drip_s)
                    else:
                        self.wfile.write(body if reply.cut is None else body[: reply.cut])
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (a hang past its timeout): what the test wanted
                if reply.cut is not None:
                    self.close_connection = True

            def log_message(self, *args):  # quiet
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _drip(self, out, body: bytes, every_s: float) -> None:
        for index in range(len(body)):
            if self._release.wait(every_s):
                return
            out.write(body[index : index + 1])
            out.flush()

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
