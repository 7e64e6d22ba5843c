"""A loopback HTTP server of the prefix tests' own: it records every request, whatever its method, and answers as a
small vLLM (or with one fixed status and body: an upstream that must never be quoted back)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ragcache.storage.processes import free_port


class RecordingServer:
    """Loopback HTTP server that records every request, whatever its method, and answers ``status`` with ``body``
    (a vLLM stand-in when ``body`` is None, whose /tokenize counts ``num_tokens``, numbered 0..num_tokens-1)."""

    def __init__(self, status: int = 200, body: bytes | None = None, num_tokens: int = 12) -> None:
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                server.requests.append((self.command, self.path))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                payload = body if body is not None else _vllm_answer(self.path, num_tokens)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815 - http.server's names

            def log_message(self, *args):  # quiet
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def _vllm_answer(path: str, num_tokens: int) -> bytes:
    if path == "/tokenize":
        return json.dumps({"count": num_tokens, "tokens": list(range(num_tokens))}).encode()
    if path == "/metrics":
        return b"# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total 0\n"
    return json.dumps({"usage": {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 0}}}).encode()
