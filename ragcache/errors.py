"""The one exception tree of ragcache.

    RagCacheError                      root: catch this to catch everything ragcache raises
    ├── InvalidInputError (ValueError) the caller sent something unusable (bad text, bad size, ...)
    │   └── InvalidTextError           a text that cannot be encoded as UTF-8 (lone surrogates)
    ├── NotFoundError (LookupError)    an unknown model, collection, space or prefix
    ├── ConflictError                  a request that contradicts stored state (e.g. another space)
    ├── ConfigError                    settings that cannot work
    ├── TierUnavailableError           a cache level or store failed (refused, timed out, gone);
    │                                  the cache turns it into a miss, callers never see it from embed()
    ├── ComputeError                   the model failed on some texts; only the requests holding them fail
    │   └── ModelOutOfMemoryError      ... because it ran out of memory (worth retrying, or sending less)
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
    "ConfigError",
    "TierUnavailableError",
    "ComputeError",
    "ModelOutOfMemoryError",
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
    """An unknown model, collection, space or prefix."""


class ConflictError(RagCacheError):
    """The request contradicts stored state, e.g. a collection that belongs to another space."""


class ConfigError(RagCacheError):
    """Settings that cannot work together, or a resource they name that does not exist."""


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


class AuthenticationError(RagCacheError):
    """The service wants an API key (401) or refuses this one (403)."""


class ServiceUnavailableError(RagCacheError):
    """The service could not be reached, timed out, or answered 502/503/504 (after the retries)."""


class ServiceError(RagCacheError):
    """The service failed in another way (a 5xx, an unexpected status, or an answer that is not its JSON)."""
