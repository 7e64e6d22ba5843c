"""Pass-through of the caller's own provider key to a remote model (``pass_through_auth``, off by default).

The caller's key comes from ``X-Upstream-Authorization: Bearer <key>``, or, when this service has no API
keys of its own, from ``Authorization`` (so an OpenAI SDK pointed at ragcache sends its key as usual). With
API keys configured, ``Authorization`` carries the ragcache key, which never leaves this service.

The trade-off (docs/providers.md): the cache is shared. A miss is computed with the key of the caller who
missed it, and the vector then serves every caller as a hit, paid for by whoever missed it first. A key
the upstream refuses or rate-limits fails only that caller's misses (a 4xx for it, 429 included, is not
retried and does not open the model's breaker), and a caller needs no valid provider key at all to be served
hits: pass-through decides who pays, not who may use the service (that is what ragcache's own API keys are for).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from fastapi import Request

from ragcache.core import EmbeddingCache
from ragcache.models import ApiKey, RemoteEncoder
from ragcache_server.errors import HTTPError

__all__ = ["UPSTREAM_HEADER", "caller_key_of", "caller_scope"]

UPSTREAM_HEADER = "X-Upstream-Authorization"
MAX_HEADER_CHARS = 4096


def caller_key_of(request: Request) -> ApiKey | None:
    """The caller's provider key, or None when it sent none; 400 naming the header when malformed."""
    settings = request.app.state.settings
    header, value = UPSTREAM_HEADER, request.headers.get(UPSTREAM_HEADER)
    has_own_keys = bool(settings.access.api_key or settings.access.api_keys or settings.access.api_keys_file)
    if value is None and not has_own_keys:
        header, value = "Authorization", request.headers.get("Authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    # Printable ASCII only: the server hands header bytes over as latin-1, and a key of other characters could
    # not be sent upstream (it was a 500 with a traceback when the outbound request encoded it).
    printable = value.isascii() and value.isprintable()
    if not printable or scheme.lower() != "bearer" or not token.strip() or len(value) > MAX_HEADER_CHARS:
        raise HTTPError(400, f"{header} must be 'Bearer <provider key>' in printable ASCII (at most {MAX_HEADER_CHARS} "
                             "characters)", field=header)
    return ApiKey(token.strip())


def caller_scope(request: Request, cache: EmbeddingCache) -> Callable[[list[str]], AbstractContextManager] | None:
    """What to enter around the cache call for ``texts``: the caller's key for their misses when ``cache``'s
    model passes keys through (headers read only then); None when there is nothing to enter."""
    encoder = cache.encoder
    if not isinstance(encoder, RemoteEncoder) or not encoder.model.pass_through_auth:
        return None
    api_key = caller_key_of(request)
    return lambda texts: encoder.caller_key(cache.model_inputs(texts), api_key)
