"""The one place that maps errors to HTTP: library errors by type, validation errors by field.

Every error answers JSON ``{"error": {"type", "message", "field"}}`` whose message says what to fix.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ragcache import (
    ComputeError,
    ConfigError,
    ConflictError,
    InvalidInputError,
    ModelOutOfMemoryError,
    NotFoundError,
    OverloadedError,
    QuotaExceededError,
    RagCacheError,
    TierUnavailableError,
    UpstreamBadResponseError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from ragcache.prefixes import TargetBadResponseError, TargetUnavailableError
from ragcache_server.responses import JSONResponse

log = logging.getLogger(__name__)

STATUS_BY_ERROR: list[tuple[type[Exception], int, str]] = [
    (InvalidInputError, 422, "invalid_request"),
    (NotFoundError, 404, "not_found"),
    (QuotaExceededError, 409, "quota_exceeded"),  # documents per collection or tenant (ragcache.retrieval.DocumentQuota)
    (ConflictError, 409, "conflict"),
    (TierUnavailableError, 503, "unavailable"),
    (ModelOutOfMemoryError, 503, "model_out_of_memory"),
    # A remote model (ragcache.models.remote): the gateway statuses, the message naming the model.
    (UpstreamUnavailableError, 503, "upstream_unavailable"),
    (UpstreamTimeoutError, 504, "upstream_timeout"),
    (UpstreamBadResponseError, 502, "upstream_bad_response"),
    (TargetBadResponseError, 502, "upstream_bad_response"),  # vLLM answered what it never sends
    # 503, not 429: the whole server is busy, whoever asks; 429 is one key over its own rate.
    (OverloadedError, 503, "overloaded"),
    (ComputeError, 500, "model_failed"),
    (ConfigError, 500, "server_config"),
    (RagCacheError, 500, "internal"),
]
# Failures the service expects in operation (an upstream, vLLM or a level down, refused, slow, answering garbage,
# or its breaker open; the queue full): one log line each, no traceback, since their message says all there is to know.
EXPECTED_ERRORS: tuple[type[Exception], ...] = (UpstreamError, TargetUnavailableError, TierUnavailableError, OverloadedError)
# Tracebacks of unexpected failures: at most this many per window, so a failing path cannot fill the disk.
TRACEBACKS_PER_WINDOW = 10
TRACEBACK_WINDOW_S = 60.0
# pydantic puts the union member it tried into the location ("inputs", "list[str]", 1): not a field name.
_UNION_TAGS = {"str", "int", "bool", "float", "list", "dict", "none"}


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and ("[" in part or part in _UNION_TAGS or part.startswith(("constrained-", "function-")))


class TracebackBudget:
    """At most ``limit`` tracebacks per ``window_s``; past it, failures log one line that counts the skipped."""

    def __init__(self, limit: int = TRACEBACKS_PER_WINDOW, window_s: float = TRACEBACK_WINDOW_S, clock=time.monotonic):
        self._limit, self._window_s, self._clock = limit, window_s, clock
        self._lock = threading.Lock()
        self._window_start = float("-inf")
        self._num_in_window = self._num_skipped = 0

    def take(self) -> tuple[bool, int]:
        """(whether this failure may log its traceback, tracebacks skipped since the last one logged)."""
        with self._lock:
            now = self._clock()
            if now - self._window_start >= self._window_s:
                self._window_start, self._num_in_window = now, 0
            if self._num_in_window < self._limit:
                self._num_in_window += 1
                skipped, self._num_skipped = self._num_skipped, 0
                return True, skipped
            self._num_skipped += 1
            return False, self._num_skipped


def log_failure(budget: TracebackBudget, what: str, exc: BaseException) -> None:
    """One line for an expected failure; a traceback for an unexpected one, within ``budget``."""
    if isinstance(exc, EXPECTED_ERRORS):
        log.warning("%s failed: %s", what, exc)
        return
    with_traceback, skipped = budget.take()
    if with_traceback:
        suffix = f" ({skipped} tracebacks skipped before this one)" if skipped else ""
        log.error("%s failed unexpectedly%s: %s", what, suffix, exc, exc_info=exc)
    else:
        log.error("%s failed unexpectedly: %s: %s (traceback skipped: over %d a minute)", what, type(exc).__name__, exc,
                  TRACEBACKS_PER_WINDOW)


class HTTPError(Exception):
    """A service-level refusal with its own status (e.g. 413 for a batch over the limit)."""

    def __init__(self, status: int, message: str, *, field: str | None = None, type: str = "invalid_request"):  # noqa: A002 - the JSON field's name
        super().__init__(message)
        self.status, self.message, self.field, self.type = status, message, field, type


def error_response(status: int, type_: str, message: str, field: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse({"error": {"type": type_, "message": message, "field": field}}, status_code=status, headers=headers)


def field_path(loc: tuple) -> str:
    # A location starts with where the value came from (body, path, query): the field is named without it.
    parts = [part for index, part in enumerate(loc) if not (index == 0 and part in ("body", "path", "query"))
             and not _is_union_tag(part)]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(error.get("type") == "json_invalid" for error in errors):
        return error_response(400, "invalid_json", "the request body is not valid JSON: " + errors[0].get("msg", ""), "body")
    # For a union (str | list[str]) pydantic reports one error per member: keep the deepest per field.
    best: dict[str, dict] = {}
    for error in errors:
        path = field_path(tuple(error["loc"]))
        top = path.split("[")[0].split(".")[0]
        # A list over its max_length says more than "not a string" (or "not a token id", deeper) from the union's
        # other members: it is kept over them.
        if top in best and best[top].get("type") == "too_long":
            continue
        if top not in best or error.get("type") == "too_long" or len(error["loc"]) > len(best[top]["loc"]):
            best[top] = {**error, "path": path}
    messages = [f"{error['path']}: {error['msg']}" for error in best.values()]
    first = next(iter(best.values()))
    return error_response(422, "invalid_request", "; ".join(messages), first["path"])


def _methods_of(request: Request) -> list[str]:
    """The methods some route serves at the request's path, asked the router itself (included routers too)."""
    allowed = []
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.routes):
            allowed.append(method)
    return allowed


def install_error_handlers(app: FastAPI) -> None:
    tracebacks = TracebackBudget()

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError):
        return _validation_response(exc)

    @app.exception_handler(HTTPError)
    async def on_http_error(request: Request, exc: HTTPError):
        return error_response(exc.status, exc.type, exc.message, exc.field)

    @app.exception_handler(RagCacheError)
    async def on_library_error(request: Request, exc: RagCacheError):
        for error_type, status, type_ in STATUS_BY_ERROR:
            if isinstance(exc, error_type):
                if isinstance(exc, OverloadedError):  # expected under load: no traceback, a hint when to retry
                    log.warning("%s %s refused: %s", request.method, request.url.path, exc)
                    headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
                    return error_response(status, type_, str(exc), None, headers)
                if status >= 500:
                    log_failure(tracebacks, f"{request.method} {request.url.path}", exc)
                return error_response(status, type_, str(exc), getattr(exc, "field", None))
        raise exc  # unreachable: RagCacheError is the last row

    @app.exception_handler(StarletteHTTPException)
    async def on_starlette_error(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see /docs for the API"
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}; see /docs"
            # Every route of the path, not only the first one the router tried (DELETE and POST /documents).
            allowed = _methods_of(request)
            if allowed:
                headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        return error_response(exc.status_code, "http", message, headers=headers)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        log_failure(tracebacks, f"{request.method} {request.url.path}", exc)
        return error_response(500, "internal", f"internal error ({type(exc).__name__}); the server log has details")
