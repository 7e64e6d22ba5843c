"""The embedding routes' one path: ``/embed``, TEI's ``POST /`` and ``/v1/embeddings``.

A request is parsed and validated once, by the route's pydantic model, into one ``EmbedCall`` (what was asked, in
the service's terms), and ``answer`` does the rest for every caller of it: the FastAPI routes (routes_embed.py)
and ``EmbedFastPath``, which serves the same three routes without FastAPI's router, dependency solving and
exception layers (a third of an L1 hit's CPU, ``ragcache bench http-floor``).

``EmbedFastPath`` sits inside every middleware of the app (tracing, keys and scopes, rate limits, the body bound and
the deadline: ``ragcache_server/app.py``), so what it answers has passed the same checks as any route: a key
without the ``embed`` scope is refused before it. It takes only what it can parse: a JSON POST to one of the three
exact paths whose body the route's own model validates; anything else (another content type, a body that does not
validate, a ``root_path``) goes on to FastAPI unchanged, with the body it read handed over, and gets the same
answer, 422s included, as before. Errors raised while answering are turned into responses by the app's own
exception handlers (``install_error_handlers``), so they read the same on either path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson
import pybase64
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ragcache import InvalidInputError
from ragcache_server.limits import replay_body
from ragcache_server.schemas import EmbedRequest, OpenAIEmbeddingsRequest

__all__ = ["EmbedCall", "EmbedFastPath", "FAST_PATHS", "FastPathCounts", "call_of", "openai_base64_answer"]

Shape = Literal["tei", "openai"]
# The routes' paths and the shape of their bodies and answers.
FAST_PATHS: dict[str, Shape] = {"/embed": "tei", "/": "tei", "/v1/embeddings": "openai"}
_MODELS: dict[Shape, type[BaseModel]] = {"tei": EmbedRequest, "openai": OpenAIEmbeddingsRequest}


@dataclass(frozen=True)
class EmbedCall:
    """One embedding request, validated: what both paths answer from."""

    shape: Shape
    inputs: str | list[str]  # as sent: one text or a list (a list names its items inputs[i] in errors)
    field: str  # the body's name for them: "inputs" (TEI) or "input" (OpenAI)
    model: str | None
    prompt_name: str | None
    input_type: str | None
    normalize: bool  # TEI's flag; OpenAI's vectors are the model's own
    truncate: bool | None  # None: the server's setting
    encoding: Literal["json", "float", "base64"]  # json: TEI's list of lists; float/base64: OpenAI's encoding_format
    dimensions: int | None


def call_of(body: BaseModel) -> EmbedCall:
    """The ``EmbedCall`` of a validated body of either route."""
    if isinstance(body, EmbedRequest):
        return EmbedCall("tei", body.inputs, "inputs", body.model, body.prompt_name, body.input_type, body.normalize,
                         body.truncate, "json", None)
    assert isinstance(body, OpenAIEmbeddingsRequest)
    return EmbedCall("openai", body.input, "input", body.model, body.prompt_name, body.input_type, False, None,
                     body.encoding_format, body.dimensions)


def openai_base64_answer(vectors: np.ndarray, model: str, num_tokens: int) -> bytes:
    """OpenAI's answer with base64 rows, byte for byte what orjson writes for it, built straight from the row buffer:
    one base64 encoding of the whole matrix (a 384-d float32 row is 1,536 bytes, a multiple of 3, so each row's
    encoding is an exact slice of it), framed by ``_base64_answer.join_rows`` in one pass where it was built."""
    row_bytes = vectors.shape[1] * vectors.itemsize if vectors.ndim == 2 else 0
    if not len(vectors) or not row_bytes:
        encoded, width = b"", 4  # no rows: any width frames nothing
    elif row_bytes % 3:  # rows whose encodings end in padding: encoded one by one, each as wide as the others
        rows = [pybase64.b64encode(row.tobytes()) for row in vectors]
        encoded, width = b"".join(rows), len(rows[0])
    else:
        encoded, width = pybase64.b64encode(np.ascontiguousarray(vectors).data), row_bytes // 3 * 4
    tail = b'],"model":%b,"usage":{"prompt_tokens":%d,"total_tokens":%d}}' % (orjson.dumps(model), num_tokens, num_tokens)
    return join_rows(encoded, width, _ANSWER_HEAD, tail)


_ANSWER_HEAD = b'{"object":"list","data":['
# A row's item as orjson writes {"object", "embedding", "index"}: its opening, and what closes row i.
_ROW_OPENING = b'{"object":"embedding","embedding":"'


def _join_rows(encoded: bytes | memoryview, width: int, head: bytes, tail: bytes, /) -> bytes:
    """``_base64_answer.join_rows`` in Python: ``head``, each ``width``-byte row of ``encoded`` as an item of OpenAI's
    ``data``, ``tail``; the rows are views, copied once, by the join."""
    view = memoryview(encoded)
    parts: list[bytes | memoryview] = [head]
    for index, start in enumerate(range(0, len(view), width)):
        parts += (b"," + _ROW_OPENING if index else _ROW_OPENING, view[start : start + width], b'","index":%d}' % index)
    parts.append(tail)
    return b"".join(parts)


try:
    from ragcache_server._base64_answer import join_rows
except ImportError:  # built by `pip install` where a C compiler is
    join_rows = _join_rows


Answer = Callable[[EmbedCall, Request], Awaitable[Response]]


@dataclass
class FastPathCounts:
    """What ``EmbedFastPath`` did (``app.state.embed_fast_path``): the tests check that it really is taken."""

    num_served: int = 0  # answered on the fast path (errors included: they are answers too)
    num_handed_over: int = 0  # bodies it read and handed to FastAPI (they did not validate)


class EmbedFastPath:
    """The three embedding routes without FastAPI's layers (the module docstring); ``answer`` is routes_embed's."""

    def __init__(self, app: ASGIApp, *, answer: Answer, error_handlers: Callable[[], dict[Any, Callable]],
                 counts: FastPathCounts):
        self.app = app
        self._answer = answer
        self._error_handlers = error_handlers
        self._counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shape = FAST_PATHS.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if shape is None or scope.get("root_path") or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        try:
            call = call_of(_MODELS[shape].model_validate_json(body))
        except ValidationError:
            # FastAPI validates again and answers its 422, worded as for every other route.
            self._counts.num_handed_over += 1
            await self.app(scope, replay_body(body, receive), send)
            return
        request = Request(scope, receive)
        try:
            response = await self._answer(call, request)
        except Exception as exc:  # noqa: BLE001 - handed to the app's own handlers, which answer every error
            response = await self._error_response(request, exc)
        self._counts.num_served += 1
        await response(scope, receive, send)

    async def _error_response(self, request: Request, exc: Exception) -> Response:
        handlers = self._error_handlers()
        for kind in type(exc).__mro__:
            if kind in handlers:
                return await handlers[kind](request, exc)
        raise exc


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


async def _read_body(receive: Receive) -> bytes:
    """The whole body (LimitsMiddleware, outside, bounds its size and its time)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def check_dimensions(call: EmbedCall, model: str, dim: int) -> None:
    """OpenAI's ``dimensions``: only the model's own is served."""
    if call.dimensions is not None and call.dimensions != dim:
        raise InvalidInputError(f"dimensions={call.dimensions} is not available: {model} gives {dim} dimensions only",
                                field="dimensions")
