"""The one exception tree of ragcache.

    RagCacheError                      root: catch this to catch everything ragcache raises
    ├── InvalidInputError (ValueError) the caller sent something unusable (bad text, bad size, ...)
    │   └── InvalidTextError           a text that cannot be encoded as UTF-8 (lone surrogates)
    ├── NotFoundError (LookupError)    an unknown model, collection, space or prefix
    ├── ConflictError                  a request that contradicts stored state (e.g. another space)
    │   └── QuotaExceededError         a write would pass a stored quota (documents per collection or tenant)
    ├── ConfigError                    settings that cannot work
    │   └── DataFolderInUseError       another process (a service) holds the data folder
    ├── TierUnavailableError           a cache level or store failed (refused, timed out, gone);
    │                                  the cache turns it into a miss, callers never see it from embed()
    ├── ComputeError                   the model failed on some texts; only the requests holding them fail
    │   ├── ModelOutOfMemoryError      ... because it ran out of memory (worth retrying, or sending less)
    │   ├── PartialEncodeError         some texts of a call got vectors, others an error (``outcome``)
    │   └── UpstreamError              a remote model (ragcache.models.remote) failed; names the model, never
    │       │                          its key or the credentials in its URL
    │       ├── UpstreamUnavailableError   refused, unreachable, rate-limited past the retries, breaker open (503)
    │       ├── UpstreamTimeoutError       no answer within the model's timeout (504)
    │       └── UpstreamBadResponseError   an answer that is an error or cannot be trusted (502): nothing cached
    ├── OverloadedError                the model's queue is full (``compute_max_pending``): retry later
    └── raised by the HTTP client (ragcache.client) only:
        ├── AuthenticationError        the service wants an API key (401) or refuses this one (403)
        ├── ServiceUnavailableError    unreachable, timed out, or 502/503/504 after the retries
        └── ServiceError               any other failure of the service (5xx, an answer that is not its JSON)

Foreign exceptions (redis, pymilvus, torch) are converted where they happen, with ``raise ... from exc``,
so the cause stays visible in tracebacks while callers only ever handle this tree.
"""

from __future__ import annotations

__all__ = [
    "RagCacheError",
    "InvalidInputError",
    "InvalidTextError",
    "NotFoundError",
    "ConflictError",
    "QuotaExceededError",
    "ConfigError",
    "DataFolderInUseError",
    "TierUnavailableError",
    "ComputeError",
    "ModelOutOfMemoryError",
    "PartialEncodeError",
    "UpstreamError",
    "UpstreamUnavailableError",
    "UpstreamTimeoutError",
    "UpstreamBadResponseError",
    "OverloadedError",
    "AuthenticationError",
    "ServiceUnavailableError",
    "ServiceError",
]


class RagCacheError(Exception):
    """Root of every error ragcache raises."""


class InvalidInputError(RagCacheError, ValueError):
    """The input cannot be used; the message names the field and what to fix."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidTextError(InvalidInputError):
    """A text that is not valid Unicode for UTF-8 (for example a lone surrogate)."""

    def __init__(self, message: str, *, index: int, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.index = index


class NotFoundError(RagCacheError, LookupError):
    """An unknown model, collection, space or prefix; ``field`` names which (``model``, ``collection``), so a
    caller can tell a collection not yet written (an empty store) from a model the service does not serve."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ConflictError(RagCacheError):
    """The request contradicts stored state, e.g. a collection that belongs to another space."""


class QuotaExceededError(ConflictError):
    """A write would take what is stored past a quota (``ragcache.retrieval.DocumentQuota``): nothing was written;
    ``field`` names what to send less of."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ConfigError(RagCacheError):
    """Settings that cannot work together, or a resource they name that does not exist."""


class DataFolderInUseError(ConfigError):
    """Another process holds the data folder (``ragcache.storage.data_folder``): a running service, or a cache opened
    on it elsewhere. Two processes on one folder's embedded Redis and Milvus Lite files would lose data."""


class TierUnavailableError(RagCacheError):
    """A cache level failed: refused, timed out, or is gone. The cache counts it and treats it as a miss."""

    def __init__(self, tier: str, message: str) -> None:
        super().__init__(f"{tier}: {message}")
        self.tier = tier


class ComputeError(RagCacheError):
    """The model failed while computing embeddings; the message names the cause. Other requests batched
    with the failing texts are computed again without them, so only the requests holding them fail."""


class ModelOutOfMemoryError(ComputeError):
    """The model ran out of (device) memory: transient, worth a retry, or a smaller or shorter batch."""


class PartialEncodeError(ComputeError):
    """An encoder call that split its texts over several upstream requests, some of which failed.
    ``outcome`` holds, per text in order, its vector or the error of the request that carried it, so only
    the callers waiting for the failed texts fail."""

    def __init__(self, outcome: list) -> None:
        errors = [result for result in outcome if isinstance(result, Exception)]
        super().__init__(f"{len(errors)} of {len(outcome)} texts failed; first: {errors[0] if errors else None}")
        self.outcome = outcome


class UpstreamError(ComputeError):
    """A remote embedding model failed. ``model`` is the name clients call it by; the message never holds
    its key or URL credentials. ``per_text`` is True when the upstream refused something about the texts
    (a 400 or 413): the batcher then splits the batch to find them, as it does for a local model's failure;
    otherwise the upstream itself failed, and splitting would only multiply calls to a failing server."""

    def __init__(self, model: str, message: str, *, per_text: bool = False, status_code: int | None = None) -> None:
        super().__init__(f"model {model!r}: {message}")
        self.model = model
        self.per_text = per_text
        self.detail = message  # the message without the model's name, for a caller that names the upstream itself
        self.status_code = status_code  # the upstream's HTTP status, when it answered one


class UpstreamUnavailableError(UpstreamError):
    """The upstream refused the connection, kept answering 429 or 5xx past the retries, or its breaker is
    open: worth retrying later."""


class UpstreamTimeoutError(UpstreamError):
    """The upstream did not answer within the model's timeout (retries included)."""


class UpstreamBadResponseError(UpstreamError):
    """The upstream answered, but with an error status or with something that cannot be trusted (malformed,
    wrong count, wrong dimension, NaN or infinity, indices out of order). Never cached."""


class OverloadedError(RagCacheError):
    """Too many texts already wait for the model (``compute_max_pending``): nothing of this call was queued.
    ``retry_after_s`` estimates when the queue will have drained."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class AuthenticationError(RagCacheError):
    """The service wants an API key (401) or refuses this one (403)."""


class ServiceUnavailableError(RagCacheError):
    """The service could not be reached, timed out, or answered 502/503/504 (after the retries)."""


class ServiceError(RagCacheError):
    """The service failed in another way (a 5xx, an unexpected status, or an answer that is not its JSON)."""
