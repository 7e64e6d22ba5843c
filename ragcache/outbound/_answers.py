"""What an upstream's answer means: a status read into the ``UpstreamError`` family (or a retry), masked.

``Upstream`` (``_upstream.py``) decides when to call, retry and open a breaker; this module only reads one answer:
which statuses are worth another try, which were the texts' fault (``per_text``), which are a refusal of a caller's
own key (pass-through: that caller's problem, ``CallersOwn``), what of the upstream's message may be quoted (cut
short, keys and URL credentials masked, never a 401/403 body) and how long ``Retry-After`` asks to wait.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from typing import Protocol

from ragcache.errors import UpstreamBadResponseError, UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from ragcache.observe.redact import redact_text

__all__ = ["CallersOwn", "Retry", "Secret", "callers_own", "kind_of", "masked", "retry_after_s", "status_error"]

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
PER_TEXT_STATUSES = frozenset({400, 413, 422})  # the upstream refused something in the request's texts
CREDENTIAL_STATUSES = frozenset({401, 403})  # their messages quote parts of keys: never relayed
MAX_ERROR_EXCERPT = 200


class Secret(Protocol):
    """A key that does not print (``ragcache.models.remote.ApiKey``): the header that carries it, and a scrubber."""

    def header(self) -> str: ...

    def scrub(self, text: str) -> str: ...


class Retry(Exception):
    """An attempt worth repeating; ``final`` is the error to raise when no retry is left."""

    def __init__(self, final: UpstreamError, retry_after: float | None = None):
        super().__init__(str(final))
        self.final, self.retry_after_s = final, retry_after


class CallersOwn(UpstreamError):
    """Marks an answer refused for a caller's own key (pass-through): that caller's problem, not the upstream's."""


class CallersOwnUnavailable(CallersOwn, UpstreamUnavailableError):
    pass


class CallersOwnBadResponse(CallersOwn, UpstreamBadResponseError):
    pass


class CallersOwnTimeout(CallersOwn, UpstreamTimeoutError):
    pass


def status_error(name: str, status: int, headers: Mapping[str, str], body: bytes, url: str, shown: str, *,
                 caller_key: Secret | None, api_key: Secret | None) -> Exception:
    """The error (or the retry) a non-2xx answer of ``url`` (``shown`` as errors show it) means for the upstream
    ``name``, called with ``caller_key`` (pass-through) or else its own ``api_key``. The upstream's message is quoted
    cut short and masked of both keys, never for 401/403, whose messages quote parts of keys."""
    keys = (caller_key, api_key)
    said = f"the upstream at {shown} answered {status}"
    wait_s = retry_after_s(headers)
    if status == 429:
        said += " (rate limited" + (f"; it asked to wait {wait_s:g} s)" if wait_s is not None else ")")
    if caller_key is not None and status < 500:
        # The caller's own key was refused or rate-limited: theirs to fix, not a reason to retry or to
        # close the model for everyone else.
        said += " for the caller's own key (pass-through)"
        callers_class = CallersOwnUnavailable if status == 429 else CallersOwnBadResponse
        if status not in CREDENTIAL_STATUSES:
            said += f": {_excerpt(body, url, keys)}"
        return callers_class(name, said, per_text=status in PER_TEXT_STATUSES, status_code=status)
    if status in RETRY_STATUSES:
        class_by_status = {429: UpstreamUnavailableError, 503: UpstreamUnavailableError, 504: UpstreamTimeoutError}
        return Retry(class_by_status.get(status, UpstreamBadResponseError)(name, said, status_code=status), wait_s)
    if status in CREDENTIAL_STATUSES:
        return UpstreamBadResponseError(name, f"{said}: it refused the credentials", status_code=status)
    said += f": {_excerpt(body, url, keys)}"
    return UpstreamBadResponseError(name, said, per_text=status in PER_TEXT_STATUSES, status_code=status)


def _excerpt(body: bytes, url: str, keys: tuple[Secret | None, ...]) -> str:
    """The first ``MAX_ERROR_EXCERPT`` bytes of an error body, masked first and cut after: cut first, a key that
    straddles the cut would no longer match its mask and its start would be shown (the body is already within
    the call's byte cap, and this is the failure path)."""
    text = masked(body.decode("utf-8", "replace"), url, keys).strip()
    return text.encode("utf-8")[:MAX_ERROR_EXCERPT].decode("utf-8", "ignore").strip()


def masked(text: str, url: str, keys: tuple[Secret | None, ...]) -> str:
    """``text`` with each of ``keys`` and ``url``'s credentials masked."""
    for key in keys:
        if key is not None:
            text = key.scrub(text)
    return redact_text(text, url)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
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


def callers_own(error: UpstreamError) -> UpstreamError:
    """``error`` (of the same kind, so the same status for the caller) saying it was met with the caller's own key."""
    if isinstance(error, UpstreamTimeoutError):
        kind: type[UpstreamError] = CallersOwnTimeout
    elif isinstance(error, UpstreamUnavailableError):
        kind = CallersOwnUnavailable
    else:
        kind = CallersOwnBadResponse
    detail = f"{error.detail} (with the caller's own key, pass-through: counted against that key only)"
    return kind(error.model, detail, status_code=error.status_code)


def kind_of(error: UpstreamError) -> str:
    """The kind an observer counts a failed call under."""
    if isinstance(error, UpstreamTimeoutError):
        return "timeout"
    if isinstance(error, UpstreamUnavailableError):
        return "unavailable"
    return "bad_response"
