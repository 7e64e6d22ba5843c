"""The part every remote encoder shares: batching to the upstream's limits, a concurrency cap, retries with
back-off, a circuit breaker, a bounded and validated answer, and the counters.

A subclass says only how its wire format looks: ``path``, ``request_body(texts)`` and
``parse(answer, num_texts)``. Everything an upstream sends back is checked before the cache sees it (count,
dimension, finite values, order): a vector that reaches the cache is one the upstream really computed for
that text, and nothing else is ever cached.

How one ``encode`` call goes:

1. texts are split into requests of at most ``max_inputs`` texts and ``max_tokens`` tokens (``tokens.py``);
2. the requests go out in parallel, at most ``concurrency`` at a time to this upstream (all callers);
3. each request is tried, and on 429, 5xx, a refused or dropped connection tried again after an
   exponential back-off with jitter (or the upstream's ``Retry-After``), all within ``timeout_s``;
4. a request that fails for good opens the breaker (``TierHealth``, the levels' breaker): calls fail at
   once, except one probe per back-off, until a probe succeeds;
5. a failure fails only the texts of that request (``PartialEncodeError`` keeps the others' vectors).
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import orjson
import torch

from ragcache.errors import (
    InvalidInputError,
    PartialEncodeError,
    UpstreamBadResponseError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from ragcache.providers.config import RemoteModel, endpoint_identity, remote_space
from ragcache.providers.credentials import ApiKey
from ragcache.providers.stats import UpstreamRecorder, UpstreamStats
from ragcache.providers.tokens import TokenCounter
from ragcache.tiers.base import TierHealth
from ragcache.tiers.compute import TORCH_DTYPES

__all__ = ["RemoteEncoder", "decode_matrix", "plan_requests"]

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
PER_TEXT_STATUSES = frozenset({400, 413, 422})  # the upstream refused something in the texts
MAX_BACKOFF_S = 8.0
# An answer's bound: JSON spends at most ~25 bytes on a float ("-0.012345678901234567, "), base64 ~5.4.
BYTES_PER_VALUE = 32
ANSWER_SLACK_BYTES = 1 << 20
MAX_ERROR_EXCERPT = 200


def plan_requests(token_counts: Sequence[int], max_inputs: int, max_tokens: int) -> list[range]:
    """Consecutive runs of texts, each at most ``max_inputs`` texts and ``max_tokens`` tokens (a text over
    ``max_tokens`` on its own goes alone: the upstream truncates or refuses it)."""
    runs: list[range] = []
    start, tokens = 0, 0
    for index, count in enumerate(token_counts):
        if index > start and (index - start >= max_inputs or tokens + count > max_tokens):
            runs.append(range(start, index))
            start, tokens = index, 0
        tokens += count
    if start < len(token_counts):
        runs.append(range(start, len(token_counts)))
    return runs


class _Retry(Exception):
    """An attempt worth repeating; ``final`` is the error to raise when no retry is left."""

    def __init__(self, final: UpstreamError, retry_after_s: float | None = None):
        super().__init__(str(final))
        self.final = final
        self.retry_after_s = retry_after_s


class _SlotsBusy(UpstreamTimeoutError):
    """Every connection to the upstream stayed busy until the call's deadline."""


class _CredentialsRefused(UpstreamBadResponseError):
    """A 401 or 403: the upstream refused the key it was sent."""


class RemoteEncoder:
    """An ``Encoder`` whose model is behind HTTP. Subclasses define the wire format."""

    path: str = ""  # appended to base_url

    def __init__(
        self,
        model: RemoteModel,
        *,
        api_key: ApiKey | None = None,
        transport: httpx.BaseTransport | None = None,
        health: TierHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ):
        self.model = model
        self.name = model.name
        self.space = remote_space(model)
        self.device = torch.device("cpu")
        # The cache's batcher hands over up to this many texts at once: enough for every slot to be busy.
        self.max_batch = model.max_inputs * model.concurrency
        self._api_key = api_key
        self._dtype = TORCH_DTYPES[model.dtype]
        self._url = model.base_url.rstrip("/") + self.path
        self._endpoint = endpoint_identity(model.base_url)
        self._tokens = TokenCounter(model.tokenizer, model_name=model.name)
        self._health = health or TierHealth()
        self._clock, self._sleep, self._jitter = clock, sleep, jitter
        self._slots = threading.BoundedSemaphore(model.concurrency)
        self._http = httpx.Client(
            transport=transport,
            limits=httpx.Limits(max_connections=model.concurrency, max_keepalive_connections=model.concurrency),
            follow_redirects=False,  # a redirect could carry the key to another host
            trust_env=False,  # no proxy from the environment sees the key unless configured here
        )
        self._pool = ThreadPoolExecutor(max_workers=model.concurrency, thread_name_prefix=f"ragcache-upstream-{model.name}")
        self._recorder = UpstreamRecorder()
        # Pass-through: text -> the keys of the callers waiting for it (caller_key), latest last.
        self._caller_keys: dict[str, list[ApiKey]] = {}
        self._caller_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, endpoint={self._endpoint!r}, model={self.model.upstream_model!r})"

    # ---- what a subclass defines ------------------------------------------------------------------------

    def request_body(self, texts: list[str]) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, answer: Any, num_texts: int) -> tuple[np.ndarray, int | None]:
        """(vectors [num_texts, any dim], tokens the upstream reports or None) from the decoded JSON answer;
        raise ``ValueError`` saying what is wrong with it."""
        raise NotImplementedError

    # ---- the Encoder protocol ---------------------------------------------------------------------------

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Vectors for ``texts`` (already ``prepare``d by the space), in the space's dtype, on the CPU."""
        texts = list(texts)
        if not texts:
            return torch.empty((0, self.space.dim), dtype=self._dtype)
        sent = [self.model.prompt + text for text in texts] if self.model.prompt else texts
        counts = self._tokens.count(sent)
        requests = [
            (positions, api_key, run)
            for positions, api_key in self._by_key(texts)
            for run in plan_requests([counts[i] for i in positions], self.model.max_inputs, self.model.max_tokens)
        ]

        def call(positions: list[int], api_key: ApiKey | None, run: range) -> np.ndarray | UpstreamError:
            chosen = positions[run.start : run.stop]
            return self._call_catching([sent[i] for i in chosen], sum(counts[i] for i in chosen), api_key)

        if len(requests) == 1:
            outcomes: list[np.ndarray | UpstreamError] = [call(*requests[0])]
        else:
            outcomes = [future.result() for future in [self._pool.submit(call, *request) for request in requests]]
        failed = [outcome for outcome in outcomes if isinstance(outcome, UpstreamError)]
        if len(failed) == len(outcomes):
            raise failed[0]
        per_text: list = [None] * len(texts)
        for (positions, _, run), outcome in zip(requests, outcomes):
            rows = [outcome] * len(run) if isinstance(outcome, UpstreamError) else list(torch.from_numpy(outcome).to(self._dtype))
            for position, row in zip(positions[run.start : run.stop], rows):
                per_text[position] = row
        if failed:
            raise PartialEncodeError(per_text)
        return torch.stack(per_text)

    def _by_key(self, texts: list[str]) -> list[tuple[list[int], ApiKey | None]]:
        """Positions of ``texts`` per key they go upstream with: a caller's own (pass-through), else the
        model's. Texts of different callers never share a request, so no caller pays for another's texts."""
        if not self._caller_keys:
            return [(list(range(len(texts))), self._api_key)]
        groups: dict[int, tuple[list[int], ApiKey | None]] = {}
        with self._caller_lock:
            for position, text in enumerate(texts):
                owners = self._caller_keys.get(text)
                api_key = owners[-1] if owners else self._api_key
                groups.setdefault(id(api_key), ([], api_key))[0].append(position)
        return list(groups.values())

    @contextmanager
    def caller_key(self, texts: Sequence[str], api_key: ApiKey | None) -> Iterator[None]:
        """While inside, misses among ``texts`` go upstream with the caller's ``api_key`` instead of the
        model's (``pass_through_auth``; a no-op when off or without a key). ``texts`` as the space prepares
        them. When two callers miss one text at once it is computed once, with the later caller's key."""
        if api_key is None or not self.model.pass_through_auth:
            yield
            return
        unique = list(dict.fromkeys(texts))
        with self._caller_lock:
            for text in unique:
                self._caller_keys.setdefault(text, []).append(api_key)
        try:
            yield
        finally:
            with self._caller_lock:
                for text in unique:
                    owners = self._caller_keys[text]
                    owners.remove(api_key)
                    if not owners:
                        del self._caller_keys[text]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as sent (prompt included): the model's tokenizer's count, or the estimate."""
        prompt = self.model.prompt or ""
        return self._tokens.count([prompt + text for text in texts])

    def check_lengths(self, texts: Sequence[str], field: str = "inputs") -> None:
        """Raise ``InvalidInputError`` naming the first text over the model's ``max_input_tokens``."""
        for index, count in enumerate(self.count_tokens(texts)):
            if count > self.space.max_seq_length:
                raise InvalidInputError(
                    f"item {index} has {count} tokens ({self._tokens.method}), over the limit of model {self.name!r} "
                    f"of {self.space.max_seq_length}; shorten it or send truncate=true",
                    field=f"{field}[{index}]",
                )

    def stats(self) -> UpstreamStats:
        return self._recorder.snapshot(
            provider=self.model.provider,
            endpoint=self._endpoint,
            token_counting=self._tokens.method,
            price_per_million_tokens=self.model.price_per_million_tokens,
            up=not self._health.is_down,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    # ---- one upstream request, with retries ------------------------------------------------------------

    def _call_catching(self, texts: list[str], num_tokens: int, api_key: ApiKey | None) -> np.ndarray | UpstreamError:
        try:
            return self._call(texts, num_tokens, api_key)
        except UpstreamError as exc:
            return exc

    def _call(self, texts: list[str], num_tokens: int, api_key: ApiKey | None) -> np.ndarray:
        if not self._health.should_try():
            self._recorder.failed("breaker_open")
            raise UpstreamUnavailableError(
                self.name, f"the upstream at {self._endpoint} is failing and skipped for a moment; last error: {self._health.last_error}"
            )
        deadline = self._clock() + self.model.timeout_s
        num_retries = 0
        while True:
            try:
                vectors, reported_tokens = self._attempt(texts, deadline, api_key)
            except _Retry as retry:
                wait_s = self._backoff_s(num_retries, retry.retry_after_s)
                if num_retries >= self.model.max_retries or self._clock() + wait_s >= deadline:
                    self._fail(retry.final)
                num_retries += 1
                self._recorder.retried()
                self._sleep(wait_s)
                continue
            except UpstreamError as exc:
                # With pass-through the keys are the callers': one refused is that caller's problem, not the
                # upstream's; and a wait for a free connection is this process's queue, not the upstream failing.
                callers_own = self.model.pass_through_auth and isinstance(exc, _CredentialsRefused)
                self._fail(exc, open_breaker=not (callers_own or isinstance(exc, _SlotsBusy)))
            if self._health.record_success():
                log.warning("model %r: the upstream at %s is back", self.name, self._endpoint)
            self._recorder.answered(len(texts), reported_tokens if reported_tokens is not None else num_tokens)
            return vectors

    def _fail(self, error: UpstreamError, *, open_breaker: bool = True):
        """Count ``error`` and raise it; the breaker opens unless the fault was in the texts (per_text)."""
        self._recorder.failed(_kind(error))
        if open_breaker and not error.per_text and self._health.record_failure(error):
            log.warning("model %r: the upstream at %s is failing, requests needing it fail until it answers: %s",
                        self.name, self._endpoint, error)
        raise error

    def _backoff_s(self, num_retries: int, retry_after_s: float | None) -> float:
        """Exponential back-off with jitter (half fixed, half random), or the upstream's Retry-After."""
        if retry_after_s is not None:
            return retry_after_s
        base = min(MAX_BACKOFF_S, self.model.retry_backoff_s * 2**num_retries)
        return base / 2 + base / 2 * self._jitter()

    def _attempt(self, texts: list[str], deadline: float, api_key: ApiKey | None) -> tuple[np.ndarray, int | None]:
        """One request: a slot, the POST, a bounded read, and the checked answer."""
        remaining = deadline - self._clock()
        if remaining <= 0 or not self._slots.acquire(timeout=remaining):
            busy = f"no answer within {self.model.timeout_s:g} s (all {self.model.concurrency} connections busy)"
            raise _SlotsBusy(self.name, busy)
        started = self._clock()
        try:
            status, headers, body = self._post(texts, deadline, api_key)
        finally:
            self._slots.release()
            self._recorder.attempt(self._clock() - started)
        if status == 200:
            return self._checked(body, len(texts))
        raise self._status_error(status, headers, body, api_key)

    def _post(self, texts: list[str], deadline: float, api_key: ApiKey | None) -> tuple[int, httpx.Headers, bytes]:
        remaining = max(0.001, deadline - self._clock())
        timeout = httpx.Timeout(remaining, connect=min(self.model.connect_timeout_s, remaining))
        limit = len(texts) * self.space.dim * BYTES_PER_VALUE + ANSWER_SLACK_BYTES
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key is not None:
            headers["Authorization"] = api_key.header()
        try:
            content = orjson.dumps(self.request_body(texts))
            with self._http.stream("POST", self._url, content=content, headers=headers, timeout=timeout) as response:
                chunks, size = [], 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise UpstreamBadResponseError(self.name, f"the answer is over {limit} bytes for {len(texts)} texts")
                    if self._clock() > deadline:  # read timeouts are per read: a trickle must not outlast the call
                        raise httpx.ReadTimeout("the answer took longer than the model's timeout")
                    chunks.append(chunk)
                return response.status_code, response.headers, b"".join(chunks)
        except httpx.TimeoutException as exc:
            late = f"no answer from {self._endpoint} within {self.model.timeout_s:g} s ({type(exc).__name__})"
            raise _Retry(UpstreamTimeoutError(self.name, late)) from None
        except httpx.TransportError as exc:
            raise _Retry(UpstreamUnavailableError(self.name, f"cannot reach {self._endpoint}: {type(exc).__name__}")) from None

    def _status_error(self, status: int, headers: httpx.Headers, body: bytes, api_key: ApiKey | None) -> Exception:
        """The error (or the retry) an answer's status means. The upstream's message is shown only for
        statuses about the request (400, 404, 413, 422), cut short and with the key masked; never for
        401/403, whose messages quote parts of keys."""
        said = f"the upstream at {self._endpoint} answered {status}"
        if status in RETRY_STATUSES:
            error_class = {429: UpstreamUnavailableError, 503: UpstreamUnavailableError, 504: UpstreamTimeoutError}
            retry_after_s = _retry_after_s(headers)
            if status == 429:
                said += " (rate limited" + (f"; it asked to wait {retry_after_s:g} s)" if retry_after_s is not None else ")")
            return _Retry(error_class.get(status, UpstreamBadResponseError)(self.name, said), retry_after_s)
        if status in (401, 403):
            whose = "the credentials (check api_key_env / api_key_file)"
            if api_key is not self._api_key:
                whose = "the caller's own key (pass-through)"
            return _CredentialsRefused(self.name, f"{said}: it refused {whose}")
        excerpt = body[:MAX_ERROR_EXCERPT].decode("utf-8", "replace").strip()
        for key in {id(k): k for k in (api_key, self._api_key) if k is not None}.values():
            excerpt = key.scrub(excerpt)
        return UpstreamBadResponseError(self.name, f"{said}: {excerpt}", per_text=status in PER_TEXT_STATUSES)

    def _checked(self, body: bytes, num_texts: int) -> tuple[np.ndarray, int | None]:
        """The answer's vectors as float32 [num_texts, dim], or ``UpstreamBadResponseError`` saying why not."""
        try:
            vectors, reported_tokens = self.parse(orjson.loads(body), num_texts)
        except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise UpstreamBadResponseError(self.name, f"the upstream's answer is not usable: {_short(exc)}") from None
        if vectors.shape != (num_texts, self.space.dim):
            if vectors.ndim == 2 and vectors.shape[0] == num_texts:
                wrong = f"the upstream returned {vectors.shape[1]} dimensions, configured {self.space.dim}"
                raise UpstreamBadResponseError(self.name, wrong)
            raise UpstreamBadResponseError(self.name, f"the upstream returned {len(vectors)} vectors for {num_texts} texts")
        if not np.isfinite(vectors).all():
            raise UpstreamBadResponseError(self.name, "the upstream returned NaN or infinite values")
        if not (isinstance(reported_tokens, int) and reported_tokens >= 0):
            reported_tokens = None
        return vectors, reported_tokens


def decode_matrix(rows: list, num_texts: int) -> np.ndarray:
    """Rows of JSON numbers as float32 [n, dim]; ValueError unless every row is a list of numbers of one
    length. float32 of the parsed double is exact for numbers an upstream printed from float32."""
    if not isinstance(rows, list):
        raise ValueError(f"expected a list of vectors, got {type(rows).__name__}")
    if len(rows) != num_texts:
        raise ValueError(f"{len(rows)} vectors for {num_texts} texts")
    if not rows:
        return np.empty((0, 0), dtype=np.float32)
    lengths = {len(row) if isinstance(row, list) else -1 for row in rows}
    if len(lengths) != 1 or -1 in lengths:
        raise ValueError("the vectors are not lists of one length")
    try:
        matrix = np.array(rows, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("a vector holds something other than numbers") from None
    if matrix.ndim != 2:
        raise ValueError("the vectors are not flat lists of numbers")
    with np.errstate(over="ignore"):
        return matrix.astype(np.float32)  # a double beyond float32's range becomes inf, then refused


def _retry_after_s(headers: httpx.Headers) -> float | None:
    """``Retry-After`` as seconds from now (the delay or the HTTP-date form), or None."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _kind(error: UpstreamError) -> str:
    if isinstance(error, UpstreamTimeoutError):
        return "timeout"
    if isinstance(error, UpstreamUnavailableError):
        return "unavailable"
    return "bad_response"


def _short(exc: Exception) -> str:
    text = str(exc)
    return (text[:MAX_ERROR_EXCERPT] + "...") if len(text) > MAX_ERROR_EXCERPT else text
