"""Errors in the shape each route family's own clients read.

Every route answers ragcache's own error body, ``{"error": {"type", "message", "field"}}`` (``errors.py``), except:

- OpenAI's routes (``/v1/*``) answer OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with OpenAI's
  statuses, so that the OpenAI SDK raises the class OpenAI's reference names: an invalid request (ragcache's 400, 413
  and 422) is 400 ``invalid_request_error`` with ``param`` (the field) and ``code`` (ragcache's own type); an unknown
  model 404 ``model_not_found``; a missing or wrong key 401 ``invalid_api_key``; a key without the scope 403
  ``permission_error``; a key over its rate 429 ``rate_limit_exceeded``; 5xx ``server_error``. ``field`` stays, an
  extra key, for clients that read ragcache's shape.
- text-embeddings-inference's routes (``/embed``, ``/``, ``/tokenize``, ``/decode``, and ``/rerank`` with TEI's body,
  ``texts``) answer TEI's ``{"error": "<message>", "error_type": "Validation" | "Tokenizer" | "Overloaded" |
  "Backend" | "Unhealthy"}``, with ragcache's ``type`` and ``field`` beside it; the statuses stay ragcache's.

One ASGI layer outside every check (keys, rate limits, the body bound and the deadline answer errors too) rewrites an
error's body on those paths only; a success passes through it untouched.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from starlette._utils import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["TEI_PATHS", "ErrorShapes", "openai_error", "shape_of", "tei_error"]

Shape = Literal["openai", "tei", "rerank"]
TEI_PATHS = frozenset({"/embed", "/", "/tokenize", "/decode"})
# OpenAI's status for each of ragcache's, and the error type OpenAI gives it (its SDK picks the class by status).
_OPENAI_STATUS = {413: 400, 422: 400}
_OPENAI_TYPE = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
                408: "invalid_request_error", 409: "invalid_request_error", 429: "requests"}
_OPENAI_CODE = {401: "invalid_api_key", 429: "rate_limit_exceeded"}


def shape_of(path: str) -> Shape | None:
    """The error shape of a route path; None: ragcache's own."""
    if path.startswith("/v1/"):
        return "openai"
    if path in TEI_PATHS:
        return "tei"
    return "rerank" if path == "/rerank" else None


def openai_error(status: int, error: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """OpenAI's status and body for ragcache's ``error`` object."""
    field, native = error.get("field"), error.get("type") or "error"
    status = _OPENAI_STATUS.get(status, status)
    code = _OPENAI_CODE.get(status, native)
    if status == 404 and native == "not_found" and field in (None, "model"):
        code = "model_not_found"  # the only thing /v1/embeddings can name and not find
    elif status == 404 and native == "http":
        code = "unknown_url"
    kind = "server_error" if status >= 500 else _OPENAI_TYPE.get(status, "invalid_request_error")
    return status, {"error": {"message": error.get("message", ""), "type": kind, "param": field, "code": code,
                              "field": field}}


def tei_error(status: int, error: dict[str, Any]) -> dict[str, Any]:
    """TEI's body for ragcache's ``error`` object."""
    native = error.get("type")
    if native == "tokenizer":
        kind = "Tokenizer"
    elif native in ("overloaded", "rate_limited") or status == 429:
        kind = "Overloaded"
    elif status == 503:
        kind = "Unhealthy"  # a store or the model's memory: the service cannot answer now
    elif status >= 500:
        kind = "Backend"
    else:
        kind = "Validation"
    return {"error": error.get("message", ""), "error_type": kind, "type": native, "field": error.get("field")}


class ErrorShapes:
    """Rewrites ragcache's error bodies on OpenAI's and TEI's routes into their shapes (the module docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shape = shape_of(get_route_path(scope)) if scope["type"] == "http" else None
        if shape is None:
            await self.app(scope, receive, send)
            return
        request_body: list[bytes] = []
        if shape == "rerank":  # TEI's shape only for TEI's body: the request is kept to tell
            async def receive_kept() -> Message:
                message = await receive()
                if message["type"] == "http.request":
                    request_body.append(message.get("body", b""))
                return message
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_shaped(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is in
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            status, body = _reshaped(shape, start["status"], b"".join(chunks), request_body)
            headers = [(name, value) for name, value in start.get("headers", []) if name.lower() != b"content-length"]
            await send({**start, "status": status, "headers": [*headers, (b"content-length", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive_kept if shape == "rerank" else receive, send_shaped)


def _reshaped(shape: Shape, status: int, body: bytes, request_body: list[bytes]) -> tuple[int, bytes]:
    try:
        error = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return status, body  # not ragcache's error body: as it is
    if not isinstance(error, dict):
        return status, body
    if shape == "rerank" and not _is_tei_rerank(b"".join(request_body)):
        return status, body  # the Cohere/Infinity body: ragcache's own shape
    if shape == "openai":
        status, shaped = openai_error(status, error)
        return status, orjson.dumps(shaped)
    return status, orjson.dumps(tei_error(status, error))


def _is_tei_rerank(body: bytes) -> bool:
    """Whether a /rerank request is TEI's (``texts``, or not Cohere's ``documents``)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return True
    return not (isinstance(parsed, dict) and "documents" in parsed)
