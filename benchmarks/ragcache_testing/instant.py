"""An OpenAI-compatible embedding upstream that answers at once: the stand-in for a GPU embedder.

A GPU serving a small model answers thousands of texts a second, so in front of it the cost that decides
throughput is the cache's own. This server costs almost nothing per text: each vector is read from a table by a
hash of the text (the same text always gets the same vector; different texts almost never do), and the answer is
written by hand, never through a framework. It runs in a process of its own (``InstantUpstream``), so its CPU is
never counted as the cache's.

    python -m ragcache_testing.instant --port 8123 --dim 384
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import xxhash

from ragcache.storage.processes import free_port, stop_process, wait_healthy

__all__ = ["InstantUpstream", "MODEL", "serve"]

MODEL = "instant-embedder"
_TABLE_ROWS = 4096  # distinct vectors; a text's row is its hash modulo this (plus a per-text sign flip)
_MAX_BODY = 64 * 1024 * 1024


class _Vectors:
    """Vectors from a hash of each text: a table row picked by the hash, scaled by a second hash, so two texts
    that share a row still get different vectors (the cache tests compare vectors bit for bit)."""

    def __init__(self, dim: int):
        rng = np.random.default_rng(0)
        self.table = rng.standard_normal((_TABLE_ROWS, dim), dtype=np.float32)

    def of(self, texts: list[str]) -> np.ndarray:
        hashes = np.fromiter((xxhash.xxh3_64_intdigest(text.encode()) for text in texts), dtype=np.uint64, count=len(texts))
        rows = self.table[(hashes % _TABLE_ROWS).astype(np.intp)]
        scale = 1.0 + ((hashes >> np.uint64(40)) & np.uint64(0xFFFF)).astype(np.float32) / 65536.0
        return rows * scale[:, None]


def _answer(vectors: _Vectors, body: bytes) -> bytes:
    request = orjson.loads(body)
    texts = request["input"]
    if isinstance(texts, str):
        texts = [texts]
    matrix = vectors.of(texts)
    if request.get("encoding_format") == "base64":
        data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()}
                for i, row in enumerate(matrix)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(matrix)]
    num_tokens = sum(len(text) // 4 + 1 for text in texts)
    return orjson.dumps({"object": "list", "data": data, "model": request.get("model", MODEL),
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}},
                        option=orjson.OPT_SERIALIZE_NUMPY)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, vectors: _Vectors) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            headers = {name.strip().lower(): value.strip() for name, _, value in
                       (line.partition(":") for line in header_lines if line)}
            length = int(headers.get("content-length", 0))
            if length > _MAX_BODY:
                break
            body = await reader.readexactly(length) if length else b""
            method, path = request_line.split(" ")[:2]
            if method == "GET":
                status, answer = 200, b'{"status":"ok"}'
            elif path.endswith("/embeddings"):
                try:
                    status, answer = 200, _answer(vectors, body)
                except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                    status, answer = 400, orjson.dumps({"error": {"message": f"bad request: {exc}"}})
            else:
                status, answer = 404, b'{"error":"not found"}'
            writer.write(b"HTTP/1.1 %d -\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (status, len(answer), answer))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError):
        pass
    finally:
        writer.close()


def serve(port: int, dim: int) -> None:
    """Serve until killed: ``GET /health`` and ``POST .../embeddings`` (OpenAI's wire format, float or base64)."""
    vectors = _Vectors(dim)

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _handle(r, w, vectors), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class InstantUpstream:
    """The instant upstream in a child process, for a ``with`` block: ``base_url`` (ending in /v1), ``model``,
    ``dim`` and ``models_json`` (ragcache's RAGCACHE_MODELS_JSON naming it, for a service or a cache)."""

    def __init__(self, dim: int = 384, *, name: str = MODEL, timeout_s: float = 30.0):
        self.dim = dim
        self.model = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._timeout_s = timeout_s
        self.process: subprocess.Popen | None = None

    @property
    def models_json(self) -> str:
        entry = {"name": self.model, "provider": "openai", "base_url": self.base_url, "upstream_model": self.model,
                 "dimensions": self.dim, "max_inputs": 256, "concurrency": 16}
        return orjson.dumps({"models": [entry]}).decode()

    def cpu_s(self) -> float:
        """CPU seconds the upstream process has used (user + system)."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> InstantUpstream:
        command = [sys.executable, "-m", "ragcache_testing.instant", "--port", str(self.port), "--dim", str(self.dim)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started = time.monotonic()
        try:
            wait_healthy(self.process, f"http://127.0.0.1:{self.port}/health", name="the instant upstream",
                         timeout_s=self._timeout_s, interval_s=0.1, log_tail=self._stderr)
        except RuntimeError:
            self.__exit__()
            raise
        self.start_s = time.monotonic() - started
        return self

    def _stderr(self) -> str:
        assert self.process is not None
        return "" if self.process.poll() is None or self.process.stderr is None else self.process.stderr.read()[-3000:]

    def __exit__(self, *exc_info) -> None:
        if self.process is not None:
            stop_process(self.process, timeout_s=5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dim", type=int, default=384)
    args = parser.parse_args(argv)
    serve(args.port, args.dim)


if __name__ == "__main__":
    main()
