"""The answer to ``/embed``, TEI's ``POST /`` and ``/v1/embeddings``: the request's bytes in, its plan
(``plan.py``), its vectors, and TEI's or OpenAI's bytes out, in one module, which is all an L1 hit passes on the edge.

``answer`` serves both ways in: FastAPI's routes (``routes.py``: the OpenAPI schema and what the fast path hands
over) and ``EmbedFastPath``, which serves the same three routes without FastAPI's router, dependency solving and
exception layers (a third of an L1 hit's CPU, ``ragcache bench http-floor``).

``EmbedFastPath`` sits inside every middleware of the app (tracing, keys and scopes, rate limits, the body bound and
the deadline: ``ragcache_server/app.py``), so what it answers has passed the same checks as any route: a key
without the ``embed`` scope is refused before it. It takes only what it can parse: a JSON POST to one of the three
exact paths whose body the route's own model validates; anything else (another content type, a body that does not
validate, a ``root_path``) goes on to FastAPI unchanged, with the body it read handed over, and gets the same
answer, 422s included, as before. Errors raised while answering are turned into responses by the app's own
exception handlers (``install_error_handlers``), so they read the same on either path.

The vectors: L1 is asked once, on the event loop (``EmbeddingCache.probe``): when it holds every text, that is the
answer, with no thread hop. Otherwise the probe carries on: its L1 answer is the walk's first step, in a group of
concurrent requests (``groups.py``) or alone (a pass-through caller's, whose misses are paid with its own key), so a
missed text asks L1 twice in all: the probe, and the model batcher's last look before computing it. Only when
truncating: a cached vector says nothing about whether its text would pass the length check, so a request that does
not truncate checks the lengths in the walk's thread first and walks alone (L1 asked by the walk and the batcher:
twice too).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pybase64
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ragcache import InvalidInputError, InvalidTextError
from ragcache.core import EmbedResult, Probe
from ragcache.observe import choose
from ragcache_server import _base64_answer_py
from ragcache_server.deps import blocking, served_count_headers
from ragcache_server.embedding.groups import EmbedGroups
from ragcache_server.embedding.plan import FAST_PATHS, REQUEST_MODELS, EmbedCall, EmbedPlan, call_of, plan_of
from ragcache_server.errors import HTTPError
from ragcache_server.limits import replay_body

__all__ = ["BASE64_ANSWER", "EmbedFastPath", "FastPathCounts", "answer", "join_rows", "openai_base64_answer"]


async def answer(call: EmbedCall, request: Request) -> Response:
    """The answer to one validated embedding request, on either path."""
    plan = await plan_of(call, request)
    result, num_tokens = await _vectors_of(plan, request.app.state.embed_groups)
    if plan.known_tokens is not None:
        num_tokens = plan.known_tokens
    elif num_tokens is None and plan.token_counts is not None:  # L1 answered on the event loop, a text never counted
        num_tokens = await blocking(plan.token_counts.total, plan.texts)
    return _response(plan, result, num_tokens)


@dataclass
class FastPathCounts:
    """What ``EmbedFastPath`` did (``app.state.embed_fast_path``): the tests check that it really is taken."""

    num_served: int = 0  # answered on the fast path (errors included: they are answers too)
    num_handed_over: int = 0  # bodies it read and handed to FastAPI (they did not validate)


class EmbedFastPath:
    """The three embedding routes without FastAPI's layers (the module docstring); ``answer`` is this module's."""

    def __init__(self, app: ASGIApp, *, answer: Callable[[EmbedCall, Request], Awaitable[Response]],
                 error_handlers: Callable[[], dict[Any, Callable]], counts: FastPathCounts):
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


async def _vectors_of(plan: EmbedPlan, groups: EmbedGroups | None) -> tuple[EmbedResult, int | None]:
    """The plan's vectors, and their total token count when the plan counts in the walk's thread (None: L1 answered
    on the event loop, or nothing to count)."""
    cache, count = plan.cache, plan.count_in_walk
    probe: Probe | None = None
    if plan.truncate:
        outcome = cache.probe(plan.texts, normalize=plan.call.normalize)
        if isinstance(outcome, EmbedResult):
            return outcome, None
        probe = outcome
        if plan.caller_scope is None and groups is not None:
            return await groups.embed(cache, plan.texts, probe=probe, normalize=plan.call.normalize, count_tokens=count)

    def work() -> tuple[EmbedResult, int | None]:
        if not plan.truncate:
            try:
                cache.tokenizer.check_lengths(plan.texts, plan.call.field)
            except InvalidTextError:
                raise  # not valid Unicode: a 422 naming the item, not a length
            except InvalidInputError as exc:
                raise HTTPError(413, str(exc), field=exc.field) from exc
        scope = plan.caller_scope
        with scope(plan.texts) if scope is not None else nullcontext():  # pass-through: the caller's key for its misses
            result = cache.embed_detailed(plan.texts, normalize=plan.call.normalize, probe=probe)
        return result, count(plan.texts) if count is not None else None

    # The cache blocks (Redis, Milvus, the model): it runs in a worker thread, off the event loop. At the
    # request deadline the thread is abandoned, not awaited; what it computes still lands in the cache.
    return await blocking(work)


def _response(plan: EmbedPlan, result: EmbedResult, num_tokens: int | None) -> Response:
    """TEI's list of vectors, or OpenAI's ``{"object": "list", "data", "model", "usage"}`` with float or base64 rows;
    ``num_tokens``: OpenAI's ``usage`` (None for TEI). The bytes are orjson's, written here (numpy rows natively)."""
    headers = served_count_headers(result.served)  # X-Cache-*: how many inputs each level served
    if plan.call.shape == "tei":
        return Response(orjson.dumps(result.vectors, option=orjson.OPT_SERIALIZE_NUMPY), headers=headers,
                        media_type="application/json")
    assert num_tokens is not None
    vectors = np.asarray(result.vectors, dtype="<f4")
    if plan.call.encoding == "base64":
        return Response(openai_base64_answer(vectors, plan.model, num_tokens), headers=headers, media_type="application/json")
    data = [{"object": "embedding", "embedding": row, "index": index} for index, row in enumerate(vectors)]
    body = {"object": "list", "data": data, "model": plan.model,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), headers=headers, media_type="application/json")


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
# Compiled where `pip install` found a C compiler, else its Python twin (a warning at import says so).
BASE64_ANSWER = choose("base64_answer", "ragcache_server._base64_answer", _base64_answer_py)
join_rows = BASE64_ANSWER.serving.join_rows
