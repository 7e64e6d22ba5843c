"""``Upstream``: one upstream service (a remote model's endpoint, a reranker, vLLM) and the only way to call it.

Here: when to call, retry and open a breaker, and how a call is sent; what one answer means (a status read into an
error, masked) is ``_answers.py``'s.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import httpx
import orjson

from ragcache.errors import UpstreamBadResponseError, UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from ragcache.observe.redact import redact_url
from ragcache.outbound._answers import (
    CallersOwn,
    CallersOwnUnavailable,
    Retry,
    Secret,
    callers_own,
    kind_of,
    masked,
    status_error,
)
from ragcache.outbound._wire import MAX_HEAD_BYTES, AnswerTooLarge, HeadTooLarge, WireTransport

if TYPE_CHECKING:  # the breaker is handed in; importing the levels here would pull torch into the HTTP client
    from ragcache.core.health import TierHealth

__all__ = ["CallLimits", "CallObserver", "Upstream"]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BACKOFF_S = 8.0
# Callers' keys whose breakers are remembered (pass-through); past it the least recently used is forgotten, which
# only forgets that key's recent failures.
MAX_CALLER_BREAKERS = 4096


class CallObserver(Protocol):
    """What a caller counts (``ragcache.models.remote.stats.UpstreamRecorder`` is one)."""

    def attempt(self, latency_s: float) -> None: ...

    def retried(self) -> None: ...

    def failed(self, kind: str) -> None: ...


@dataclass(frozen=True)
class CallLimits:
    """The bounds of every call to one upstream."""

    timeout_s: float  # the whole call: connecting, sending, every read, retries and back-off
    connect_timeout_s: float = 5.0  # establishing one connection (within timeout_s)
    max_retries: int = 0  # tries after the first, on 429, 5xx, refused, dropped or timed-out connections
    retry_backoff_s: float = 0.25  # first back-off; doubled per retry, half of it jitter, at most MAX_BACKOFF_S
    concurrency: int = 4  # most calls in flight at once (callers beyond it wait for a slot, within timeout_s)


class _SlotsBusy(UpstreamTimeoutError):
    """Every connection stayed busy until the deadline: this process's queue, not the upstream failing."""


class Upstream:
    """Calls to one upstream, each bounded the same way:

    - an overall deadline (``limits.timeout_s``) that every socket operation keeps, retries included;
    - a byte cap on the answer (``max_bytes`` per call, headers included): the body is streamed and the call aborted
      past it; the headers alone are bounded at ``MAX_HEAD_BYTES`` (64 KiB);
    - no redirects (one could carry the key to another host) and no proxy from the environment;
    - retries of 429, 5xx and dropped connections with back-off, or after the upstream's ``Retry-After``;
    - the breaker (``TierHealth``): a call that fails for good opens it, and while it is open calls fail at once
      except one probe per back-off. A refusal of a caller's own key (pass-through) is that caller's problem:
      not retried, and it leaves the breaker as it is. Any other failure of a call made with a caller's key (5xx,
      a timeout, a dropped connection) opens that key's own breaker, never the upstream's: an upstream that fails
      only for one key (or a caller who makes it fail) must not close the model for every other caller;
    - every error and log line masked: the keys and URL credentials never appear, a 401/403 body is never quoted.

    Failures raise the ``UpstreamError`` family naming ``name``; ``parse`` turns a 2xx body into the caller's
    value and raises ``ValueError`` (or ``UpstreamBadResponseError``) when it cannot be trusted, which counts
    as a failure of the upstream like any other.
    """

    def __init__(
        self,
        name: str,
        limits: CallLimits,
        *,
        api_key: Secret | None = None,
        health: TierHealth | None = None,
        observer: CallObserver | None = None,
        transport: httpx.BaseTransport | httpx.Client | WireTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ):
        self.name = name
        self.limits = limits
        # None: the caller keeps its own breaker (the prefix registry: one per vLLM target).
        self.health = health
        self._api_key = api_key
        self._observer = observer
        self._clock, self._sleep, self._jitter = clock, sleep, jitter
        self._slots = threading.BoundedSemaphore(limits.concurrency)
        self._caller_breakers: OrderedDict[bytes, TierHealth] = OrderedDict()
        self._caller_breakers_lock = threading.Lock()
        # Requests go to the transport directly, not through an ``httpx.Client``: nothing here needs its cookies,
        # auth flows, URL merging or redirect handling (no redirect is followed: one could carry the key to
        # another host; no proxy is read from the environment), and in front of a fast upstream those layers
        # cost more CPU than the call itself (``ragcache bench overhead``). A caller's own client (the prefix
        # registry's seam, shared with a benchmark's other calls) is used as it is and left open; without the
        # socket clamp of ours, its answer's deadline is checked at every chunk.
        # By default the calls go over ``WireTransport`` (pooled keep-alive sockets, httptools' compiled parser; see
        # _wire.py), which keeps the same bounds for a fraction of httpx's CPU; an httpx transport or client handed
        # in (a test's ``MockTransport``, a caller's own client) goes through httpx, its deadline checked at every chunk.
        self._owns_transport = not isinstance(transport, httpx.Client)
        self._wire: WireTransport | None = None
        if isinstance(transport, WireTransport):  # ours with a seam set (a test's resolver)
            self._wire = transport
            self._close = transport.close
        elif isinstance(transport, httpx.Client):
            client = transport
            self._send_request: Callable[[httpx.Request], httpx.Response] = (
                lambda request: client.send(request, stream=True, follow_redirects=False))
            self._close = client.close
        elif transport is not None:
            self._send_request, self._close = transport.handle_request, transport.close
        else:
            self._wire = WireTransport(limits.concurrency, connect_timeout_s=limits.connect_timeout_s)
            self._close = self._wire.close

    def post(self, url: str, body: Any, *, parse: Callable[[bytes], T], max_bytes: int, caller_key: Secret | None = None) -> T:
        """POST ``body`` as JSON to ``url``; ``parse``'s value of the answer. ``caller_key`` replaces the
        upstream's own key for a caller who pays with theirs (pass-through)."""
        return self.call("POST", url, orjson.dumps(body), parse=parse, max_bytes=max_bytes, caller_key=caller_key)

    def get(self, url: str, *, parse: Callable[[bytes], T], max_bytes: int) -> T:
        return self.call("GET", url, None, parse=parse, max_bytes=max_bytes)

    def call(self, method: str, url: str, content: bytes | None, *, parse: Callable[[bytes], T], max_bytes: int,
             caller_key: Secret | None = None) -> T:
        shown = _shown(url)
        health = self.health if caller_key is None else self._caller_breaker(caller_key)
        if health is not None and not health.should_try():
            self._count("failed", "breaker_open")
            if caller_key is not None:
                raise CallersOwnUnavailable(self.name, f"the upstream at {shown} failed for the caller's own key (pass-through) "
                                                       f"and is skipped for it for a moment; last error: {health.last_error}")
            raise UpstreamUnavailableError(
                self.name, f"the upstream at {shown} is down and skipped for a moment; last error: {health.last_error}"
            )
        deadline = self._clock() + self.limits.timeout_s
        num_retries = 0
        while True:
            try:
                value = self._attempt(method, url, content, deadline, max_bytes, caller_key, parse)
            except Retry as retry:
                wait_s = self._backoff_s(num_retries, retry.retry_after_s)
                if num_retries >= self.limits.max_retries or self._clock() + wait_s >= deadline:
                    self._fail(retry.final, shown, health, caller_key)
                num_retries += 1
                self._count("retried")
                self._sleep(wait_s)
                continue
            except UpstreamError as exc:
                self._fail(exc, shown, health, caller_key)
            if health is not None and health.record_success() and caller_key is None:
                log.warning("%s: the upstream at %s is back", self.name, shown)
            return value

    def _caller_breaker(self, caller_key: Secret) -> TierHealth | None:
        """The breaker of one caller's key (None when this upstream has no breaker): named by a digest of the key,
        so that the table holds no key in the clear."""
        if self.health is None:
            return None
        digest = hashlib.blake2b(caller_key.header().encode("utf-8", "surrogateescape"), digest_size=16).digest()
        with self._caller_breakers_lock:
            breaker = self._caller_breakers.get(digest)
            if breaker is None:
                # type(...): TierHealth is imported for type checking only (see the imports above).
                breaker = self._caller_breakers[digest] = type(self.health)(
                    self.health.backoff_initial_s, self.health.backoff_max_s, clock=self.health.clock)
                if len(self._caller_breakers) > MAX_CALLER_BREAKERS:
                    self._caller_breakers.popitem(last=False)
            else:
                self._caller_breakers.move_to_end(digest)
            return breaker

    def close(self) -> None:
        if self._owns_transport:
            self._close()

    # ---- one attempt -------------------------------------------------------------------------------------

    def _attempt(self, method: str, url: str, content: bytes | None, deadline: float, max_bytes: int,
                 caller_key: Secret | None, parse: Callable[[bytes], T]) -> T:
        remaining = deadline - self._clock()
        if remaining <= 0 or not self._slots.acquire(timeout=remaining):
            busy = f"no answer within {self.limits.timeout_s:g} s (all {self.limits.concurrency} connections busy)"
            raise _SlotsBusy(self.name, busy)
        started = self._clock()
        try:
            status, headers, body = self._send(method, url, content, deadline, max_bytes, caller_key)
        finally:
            self._slots.release()
            self._count("attempt", self._clock() - started)
        if 200 <= status < 300:
            try:
                return parse(body)
            except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError) as exc:
                said = f"the answer of {_shown(url)} is not usable: {masked(str(exc), url, (caller_key, self._api_key))}"
                raise UpstreamBadResponseError(self.name, said) from None
        raise status_error(self.name, status, headers, body, url, _shown(url), caller_key=caller_key, api_key=self._api_key)

    def _send(self, method: str, url: str, content: bytes | None, deadline: float, max_bytes: int,
              caller_key: Secret | None) -> tuple[int, Mapping[str, str], bytes]:
        remaining = max(0.001, deadline - self._clock())
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        if content is not None:
            headers["Content-Type"] = "application/json"
        key = caller_key or self._api_key
        if key is not None:
            headers["Authorization"] = key.header()
        shown = _shown(url)
        try:
            if self._wire is not None:
                try:
                    return self._wire.exchange(method, url, headers, content, seconds_left=remaining, max_bytes=max_bytes)
                except HeadTooLarge:
                    raise self._head_too_large(shown, max_bytes) from None
                except AnswerTooLarge:
                    raise UpstreamBadResponseError(self.name, f"the answer of {shown} is over {max_bytes} bytes") from None
            timeout = {"connect": min(self.limits.connect_timeout_s, remaining), "read": remaining, "write": remaining,
                       "pool": remaining}
            request = httpx.Request(method, url, content=content, headers=headers, extensions={"timeout": timeout})
            response = self._send_request(request)
            try:
                size = sum(len(name) + len(value) + 4 for name, value in response.headers.raw)
                if size > min(MAX_HEAD_BYTES, max_bytes):
                    raise self._head_too_large(shown, max_bytes)
                chunks: list[bytes] = []
                for chunk in response.stream:  # type: ignore[union-attr]
                    size += len(chunk)
                    if size > max_bytes:
                        raise UpstreamBadResponseError(self.name, f"the answer of {shown} is over {max_bytes} bytes")
                    if self._clock() > deadline:  # a transport of a test's own: no socket of ours keeps the deadline
                        raise httpx.ReadTimeout("the answer took longer than the call's deadline")
                    chunks.append(chunk)
            finally:
                response.close()
            return response.status_code, response.headers, b"".join(chunks)
        except httpx.TimeoutException as exc:
            late = f"no answer from {shown} within {self.limits.timeout_s:g} s ({type(exc).__name__})"
            raise Retry(UpstreamTimeoutError(self.name, late)) from None
        except httpx.RequestError as exc:  # refused, reset or dropped: the request may not have been handled
            raise Retry(UpstreamUnavailableError(self.name, f"{shown} cannot be reached: {type(exc).__name__}")) from None

    def _head_too_large(self, shown: str, max_bytes: int) -> UpstreamBadResponseError:
        return UpstreamBadResponseError(self.name, f"the answer of {shown} has over {min(MAX_HEAD_BYTES, max_bytes)} "
                                                   "bytes of headers (a header flood is cut off there)")

    # ---- outcomes ----------------------------------------------------------------------------------------

    def _fail(self, error: UpstreamError, shown: str, health: TierHealth | None, caller_key: Secret | None):
        """Count ``error`` and raise it; ``health`` (the upstream's breaker, or with ``caller_key`` that key's own)
        opens unless the fault was in the texts (per_text), a refusal of a caller's own key, or in this
        process's queue."""
        self._count("failed", kind_of(error))
        opens = not (error.per_text or isinstance(error, (CallersOwn, _SlotsBusy)))
        if opens and health is not None and health.record_failure(error) and caller_key is None:
            log.warning("%s: the upstream at %s is failing; calls needing it fail until it answers: %s", self.name, shown, error)
        if opens and caller_key is not None:
            # The caller's key alone is counted against; what the caller sees says so.
            raise callers_own(error) from None
        raise error

    def _backoff_s(self, num_retries: int, retry_after: float | None) -> float:
        """Exponential back-off with jitter (half fixed, half random), or the upstream's Retry-After."""
        if retry_after is not None:
            return retry_after
        base = min(MAX_BACKOFF_S, self.limits.retry_backoff_s * 2**num_retries)
        return base / 2 + base / 2 * self._jitter()

    def _count(self, event: str, *args: Any) -> None:
        if self._observer is not None:
            getattr(self._observer, event)(*args)


@functools.lru_cache(maxsize=1024)
def _shown(url: str) -> str:
    """``url`` as errors and logs show it (credentials redacted); an upstream's few URLs are parsed once, not twice a
    call (~14 us each)."""
    return redact_url(url)
