"""Request limits: requests per second per key (token buckets), body size, a deadline for reading the body and
one per request, and the worker threads the routes may use.

Together with the per-field limits (texts per request, bytes per text, ``top_k``, filter length) they bound
what one request can make the service allocate: a body is read at most ``max_body_bytes`` far, then refused.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette._utils import get_route_path
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragcache_server.errors import error_response
from ragcache_server.workers import WorkerPool, current_pool

__all__ = ["TokenBucket", "RateLimiter", "LimitsMiddleware", "replay_body"]

# Anonymous callers get one bucket per client address; this many are kept, least recently used dropped.
MAX_BUCKETS = 10_000


class TokenBucket:
    """``rate_per_s`` tokens a second, at most ``burst`` saved up; one request takes one token."""

    def __init__(self, rate_per_s: float, burst: int, now: float):
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens, self.updated = float(burst), now

    def take(self, now: float) -> float:
        """0 when a token was taken, else the seconds until one will be there."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate_per_s)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate_per_s

    def wait_s(self, now: float) -> float:
        """What ``take`` would answer, without taking a token."""
        tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate_per_s)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate_per_s


class RateLimiter:
    """One token bucket per caller; a key's own rate overrides the default (None = unlimited).

    Per process: with N replicas behind a load balancer a key gets up to N times its rate (docs/SECURITY.md).
    """

    def __init__(self, default_per_s: float | None, default_burst: int | None, clock: Callable[[], float] = time.monotonic):
        self.default_per_s, self.default_burst = default_per_s, default_burst
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, caller: str, rate_per_s: float | None = None, burst: int | None = None) -> float:
        """0 when ``caller`` may go ahead, else the seconds to wait (for ``Retry-After``)."""
        rate = rate_per_s or self.default_per_s
        if rate is None:
            return 0.0
        burst = burst or (self.default_burst if rate_per_s is None else None) or max(1, round(2 * rate))
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(caller)
            if bucket is None:  # a caller's rate and burst come from the start-up config: they never change
                bucket = self._buckets[caller] = TokenBucket(rate, burst, now)
            self._buckets.move_to_end(caller)
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
            return bucket.take(now)

    def wait_s(self, caller: str) -> float:
        """0 when ``caller`` has a token left (or no bucket yet), else the seconds until it has one."""
        with self._lock:
            bucket = self._buckets.get(caller)
            return 0.0 if bucket is None else bucket.wait_s(self._clock())


class LimitsMiddleware:
    """Refuse a body over ``max_body_bytes`` (by Content-Length up front, else while it streams in) and a
    body that is not UTF-8, then answer 504 when the app has not started its answer within ``timeout_s``.

    The body is read here, in full, before the app runs: FastAPI reads it whole anyway, and reading it here
    means an over-long stream is cut off at the limit instead of after it.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        timeout_s: float,
        body_timeout_s: float = 30.0,
        untimed_paths: frozenset[str] = frozenset(),
        workers: WorkerPool | None = None,
    ):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.timeout_s = timeout_s
        self.body_timeout_s = body_timeout_s
        self.untimed_paths = untimed_paths
        self.workers = workers or WorkerPool()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        current_pool.set(self.workers)  # the threads this app's routes may use (ragcache_server/workers.py)
        refusal = self._check_length_header(scope)
        if refusal is None:
            refusal = await self._answer_in_time(scope, receive, send)
        if refusal is not None:
            await refusal(scope, receive, send)

    async def _answer_in_time(self, scope: Scope, receive: Receive, send: Send) -> Response | None:
        """Read the body within ``body_timeout_s``, then run the app within ``timeout_s`` (none on the untimed
        paths); the refusal to send instead, if any.

        One deadline, moved once the body is in: asyncio's own timeout, not anyio's cancel scope, since this runs
        for every request (3.5 against 6.8 us under uvloop, ``ragcache bench http-floor``), and one timer, not one
        per phase. Work the routes hand to threads is abandoned on cancel (anyio's abandon_on_cancel, which a
        task's own cancellation reaches as well): the request is answered at the deadline while the thread
        finishes and its result (a cached vector) is kept.
        """
        started, reading = False, True

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        deadline = asyncio.timeout(self.body_timeout_s)
        try:
            async with deadline:
                # The request deadline starts once the body is in; the body's covers reading it, so a client that
                # trickles its body (a byte a second) cannot hold a connection and its buffer without end.
                body, refusal = await self._read_body(receive)
                reading = False
                if refusal is not None:
                    return refusal
                untimed = get_route_path(scope) in self.untimed_paths
                deadline.reschedule(None if untimed else asyncio.get_running_loop().time() + self.timeout_s)
                await self.app(scope, replay_body(body, receive), send_tracked)
                return None
        except TimeoutError:
            if not deadline.expired():
                raise  # the app's own, not this deadline's
        if reading:
            message = (
                f"the body did not arrive within {self.body_timeout_s:g} s (RAGCACHE_BODY_TIMEOUT_S): "
                "send it at once, or a smaller one"
            )
            return error_response(408, "timeout", message, "body", headers={"Connection": "close"})
        if started:
            return None  # the answer had begun: it cannot be taken back, only cut short
        message = (
            f"the request took longer than {self.timeout_s:g} s (RAGCACHE_REQUEST_TIMEOUT_S) and was abandoned; "
            "send fewer texts, or retry when the server is less busy"
        )
        return error_response(504, "timeout", message)

    def _check_length_header(self, scope: Scope):
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    return error_response(400, "invalid_request", "Content-Length is not a number", "body")
                if int(value) > self.max_body_bytes:
                    return self._too_large(int(value))
        return None

    async def _read_body(self, receive: Receive):
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", error_response(400, "invalid_request", "the client went away while sending the body", "body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", self._too_large(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"the body is not valid UTF-8 (byte {exc.start}): JSON bodies must be UTF-8"
            return b"", error_response(400, "invalid_json", reason, "body")
        return body, None

    def _too_large(self, size: int):
        message = (
            f"the body has {'more than ' if size > self.max_body_bytes else ''}{size} bytes, over this server's limit "
            f"of {self.max_body_bytes} (RAGCACHE_MAX_BODY_BYTES): split the request"
        )
        return error_response(413, "too_large", message, "body")


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body read already, then waits for the disconnect (what the client
    sends next). The limits and the embedding fast path read a body once and pass it on with this."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
