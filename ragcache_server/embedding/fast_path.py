"""The embedding routes' fast path: ``/embed``, TEI's ``POST /`` and ``/v1/embeddings`` without FastAPI's layers.

A request is parsed and validated once, by the route's pydantic model, into one ``EmbedCall`` (what was asked, in
the service's terms), and ``answer`` does the rest for every caller of it: the FastAPI routes (routes.py)
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
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ragcache_server.embedding.plan import FAST_PATHS, REQUEST_MODELS, EmbedCall, call_of
from ragcache_server.limits import replay_body

__all__ = ["EmbedFastPath", "FastPathCounts"]


Answer = Callable[[EmbedCall, Request], Awaitable[Response]]


@dataclass
class FastPathCounts:
    """What ``EmbedFastPath`` did (``app.state.embed_fast_path``): the tests check that it really is taken."""

    num_served: int = 0  # answered on the fast path (errors included: they are answers too)
    num_handed_over: int = 0  # bodies it read and handed to FastAPI (they did not validate)


class EmbedFastPath:
    """The three embedding routes without FastAPI's layers (the module docstring); ``answer`` is routes.py's."""

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
            call = call_of(REQUEST_MODELS[shape].model_validate_json(body))
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
