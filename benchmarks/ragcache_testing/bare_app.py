"""The bare floor of an embedding answer over HTTP: an ASGI app with no framework that reads and parses a request
with orjson and answers vectors it holds already, for ``ragcache bench http-floor``.

``RAGCACHE_BARE_VECTORS`` names a ``.npy`` file of float32 vectors [n, dim]. A ``/v1/embeddings`` body with
``encoding_format: base64`` is answered bytes built once at start (OpenAI's shape, base64 rows); any other is
formatted per request with orjson (JSON floats), as a JSON answer must be. The model name in the answer is
``RAGCACHE_BARE_MODEL``, so both are byte for byte what ragcache answers for the same vectors.

    uvicorn ragcache_testing.bare_app:app --http httptools --loop uvloop      (or granian --interface asgi)
"""

from __future__ import annotations

import base64
import os

import numpy as np
import orjson

__all__ = ["answer_of", "app"]


def answer_of(vectors: np.ndarray, model: str, num_tokens: int, encoding: str) -> bytes:
    """OpenAI's answer for ``vectors``, as ragcache's route writes it."""
    rows = [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors] if encoding == "base64" else list(vectors)
    data = [{"object": "embedding", "embedding": row, "index": index} for index, row in enumerate(rows)]
    return orjson.dumps({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}, option=orjson.OPT_SERIALIZE_NUMPY)


_VECTORS = np.load(os.environ["RAGCACHE_BARE_VECTORS"]).astype("<f4") if "RAGCACHE_BARE_VECTORS" in os.environ else None
_MODEL = os.environ.get("RAGCACHE_BARE_MODEL", "m")
_TOKENS = int(os.environ.get("RAGCACHE_BARE_TOKENS", "0"))
_BASE64 = answer_of(_VECTORS, _MODEL, _TOKENS, "base64") if _VECTORS is not None else b""
_HEADERS = [(b"content-type", b"application/json")]


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"] == "/health":
        answer = b'{"status":"ok"}'
    else:
        request = orjson.loads(body)
        if request.get("encoding_format") == "base64":
            answer = _BASE64
        else:
            answer = answer_of(_VECTORS, _MODEL, _TOKENS, "float")  # type: ignore[arg-type]
    await send({"type": "http.response.start", "status": 200,
                "headers": [*_HEADERS, (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})
