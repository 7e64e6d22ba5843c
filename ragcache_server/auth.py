"""API keys, scopes and tenants: who may call which route (docs/SECURITY.md has the table and the key file).

A key is looked up by the sha256 of what the client sends, compared against every configured digest with
``hmac.compare_digest`` (no early exit), so neither the key nor its position leaks through timing; keys are
never logged. With no key configured at all the service is open (``bind_refusal`` in the settings keeps such
a service on loopback unless ``--insecure``). The check runs as ASGI middleware, before the body is read:
a caller without a valid key costs the service no parsing.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import dataclass

from starlette._utils import get_route_path
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from ragcache import ConfigError
from ragcache.settings import Settings, load_file, load_json
from ragcache_server.errors import error_response
from ragcache_server.limits import RateLimiter
from ragcache_server.routes_docs import DOCS_PATHS
from ragcache_server.routes_ui import UI_PATHS

__all__ = ["SCOPES", "ROUTE_SCOPES", "OPEN_PATHS", "ApiKey", "Principal", "KeyRing", "AccessMiddleware", "principal_of"]

SCOPES = ("embed", "search", "ingest", "admin")
ANY_KEY = "any key"  # a route any valid key may call, whatever its scopes
# The dashboard's page and assets (ragcache_server/routes_ui.py) and the API docs' (routes_docs.py) are open: they
# hold no data, and every call the page makes carries the key the operator typed in.
OPEN_PATHS = frozenset({"/health", "/openapi.json"}) | UI_PATHS | DOCS_PATHS
TENANT_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9]{0,15}")
# A key given in plain text (RAGCACHE_API_KEY, or 'key' in a key file) is at least this long: a short one
# could be guessed ('openssl rand -hex 24' makes 48 characters).
MIN_KEY_CHARS = 16
# Requests with a missing or wrong key, per client address: this many at once, then this many a second;
# beyond that the address gets 429 before its key is even looked at (a guesser learns nothing more).
FAILED_AUTH_BURST = 30
FAILED_AUTH_PER_S = 2.0

# Every route of the app, by method and path template. A route missing here needs ``admin`` (a new route
# is closed until someone decides otherwise); tests/server/test_access.py checks that every route is listed.
ROUTE_SCOPES: dict[tuple[str, str], str] = {
    ("POST", "/embed"): "embed",
    ("POST", "/"): "embed",  # text-embeddings-inference's root route: /embed
    ("POST", "/tokenize"): "embed",
    ("POST", "/decode"): "embed",
    ("POST", "/v1/embeddings"): "embed",
    ("POST", "/search"): "search",
    ("POST", "/rerank"): "search",
    ("POST", "/search/batch"): "search",
    ("GET", "/collections"): "search",
    ("POST", "/documents"): "ingest",
    ("POST", "/documents/ids"): "ingest",
    ("POST", "/documents/get"): "search",
    ("DELETE", "/collections/{collection}"): "admin",
    ("DELETE", "/documents"): "admin",
    ("POST", "/prefixes"): "admin",
    ("DELETE", "/prefixes/{name}"): "admin",
    ("POST", "/prefixes/{name}/warm"): "admin",
    # RAG clients read a prefix's exact text to build their prompts and report its uses: the retrieval scope,
    # within the key's tenant (ragcache_server/prefixes_api.py), as for collections.
    ("GET", "/prefixes"): "search",
    ("GET", "/prefixes/{name}"): "search",
    ("GET", "/prefixes/{name}/stats"): "search",
    ("POST", "/prefixes/{name}/uses"): "search",
    ("POST", "/prefixes/{name}/route"): "search",  # where to send a request built on the prefix (issue 30)
    # Hit counters are shared by every tenant: watching them change would tell one tenant what another
    # embeds, so /stats and /metrics are the operator's (Prometheus sends the key as a bearer token).
    ("GET", "/stats"): "admin",
    ("GET", "/metrics"): "admin",
    ("GET", "/info"): ANY_KEY,
}


@dataclass(frozen=True)
class ApiKey:
    """One configured key: the sha256 of its text, what it may do, and whom it belongs to."""

    name: str
    sha256: bytes
    scopes: frozenset[str]
    tenant: str | None = None
    rate_limit_per_s: float | None = None
    rate_limit_burst: int | None = None


@dataclass(frozen=True)
class Principal:
    """The caller of one request, as the routes see it (``request.state.principal``)."""

    name: str
    scopes: frozenset[str]
    tenant: str | None = None


ANONYMOUS = Principal("anonymous", frozenset(SCOPES))


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class KeyRing:
    """The configured keys; empty means an open service."""

    def __init__(self, keys: list[ApiKey]):
        self.keys = tuple(keys)

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        """``api_key`` (all scopes), then ``api_keys`` (JSON text), then ``api_keys_file`` (JSON or TOML)."""
        keys: list[ApiKey] = []
        if settings.access.api_key:
            if len(settings.access.api_key) < MIN_KEY_CHARS:
                raise ConfigError(f"RAGCACHE_API_KEY must be at least {MIN_KEY_CHARS} characters "
                                  f"(got {len(settings.access.api_key)}): make one with 'openssl rand -hex 24'")
            keys.append(ApiKey("api_key", digest(settings.access.api_key), frozenset(SCOPES)))
        if settings.access.api_keys:
            keys += parse_keys(load_json(settings.access.api_keys, "RAGCACHE_API_KEYS"), "RAGCACHE_API_KEYS")
        if settings.access.api_keys_file:
            keys += parse_keys(load_file(settings.access.api_keys_file, "the API key file"), str(settings.access.api_keys_file))
        names = [key.name for key in keys]
        if len(set(names)) != len(names):
            raise ConfigError(f"API key names must be unique, got {names}")
        return cls(keys)

    def find(self, presented: str) -> ApiKey | None:
        """The key whose digest matches, comparing against all of them in constant time. A request with no
        key never matches, whatever was configured (a digest of the empty string included)."""
        if not presented:
            return None
        wanted, found = digest(presented), None
        for key in self.keys:
            if hmac.compare_digest(wanted, key.sha256):
                found = key
        return found


def parse_keys(document: object, source: str) -> list[ApiKey]:
    """Keys from ``{"keys": [{name, sha256 | key, scopes, tenant?, rate_limit_per_s?, rate_limit_burst?}]}``."""
    entries = document.get("keys") if isinstance(document, dict) else None
    # An empty list is refused, not read as "no keys": that would be an open service, and the bind check
    # (Settings.bind_refusal) already let it listen beyond loopback because a key source was given.
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: expected an object with a non-empty list 'keys'")
    return [_parse_key(entry, f"{source}: keys[{index}]") for index, entry in enumerate(entries)]


def _parse_key(entry: object, where: str) -> ApiKey:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object")
    unknown = set(entry) - {"name", "sha256", "key", "scopes", "tenant", "rate_limit_per_s", "rate_limit_burst"}
    if unknown:
        raise ConfigError(f"{where} has unknown fields {sorted(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where} needs a 'name' (it appears in logs instead of the key)")
    return ApiKey(
        name=name,
        sha256=_key_digest(entry, where),
        scopes=_scopes(entry.get("scopes"), where),
        tenant=_tenant(entry.get("tenant"), where),
        rate_limit_per_s=_positive(entry.get("rate_limit_per_s"), float, where, "rate_limit_per_s"),
        rate_limit_burst=_positive(entry.get("rate_limit_burst"), int, where, "rate_limit_burst"),
    )


def _key_digest(entry: dict, where: str) -> bytes:
    hashed, plain = entry.get("sha256"), entry.get("key")
    if (hashed is None) == (plain is None):
        raise ConfigError(f"{where} needs exactly one of 'sha256' (hex digest of the key, preferred) or 'key'")
    if plain is not None:
        if not isinstance(plain, str) or len(plain) < MIN_KEY_CHARS:
            raise ConfigError(f"{where}: 'key' must be a string of at least {MIN_KEY_CHARS} characters")
        return digest(plain)
    if not isinstance(hashed, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", hashed):
        raise ConfigError(f"{where}: 'sha256' must be 64 hex digits "
                          f"(python -c \"import hashlib; print(hashlib.sha256(b'KEY').hexdigest())\")")
    if bytes.fromhex(hashed) == digest(""):
        raise ConfigError(f"{where}: 'sha256' is the digest of the empty string, which would let requests without a key in")
    return bytes.fromhex(hashed)


def _scopes(value: object, where: str) -> frozenset[str]:
    if value == "*" or value == ["*"]:
        return frozenset(SCOPES)
    if not isinstance(value, list) or not value or not all(scope in SCOPES for scope in value):
        raise ConfigError(f"{where}: 'scopes' must be a non-empty list of {list(SCOPES)}, or \"*\" for all")
    return frozenset(value)


def _tenant(value: object, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not TENANT_PATTERN.fullmatch(value):
        raise ConfigError(f"{where}: 'tenant' must be a letter then up to 15 letters or digits, got {value!r}")
    return value


def _positive(value: object, kind: type, where: str, field: str):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}: '{field}' must be a positive number")
    if kind is int and value != int(value):
        raise ConfigError(f"{where}: '{field}' must be a whole number")
    return kind(value)


def route_table(routes: list[tuple[str, str]]) -> list[tuple[str, re.Pattern, str]]:
    """(method, path pattern, scope) for the app's routes: each from ``ROUTE_SCOPES``, ``admin`` if unlisted."""
    return [(method, compile_path(path)[0], ROUTE_SCOPES.get((method, path), "admin")) for method, path in routes]


def required_scope(table: list[tuple[str, re.Pattern, str]], method: str, path: str) -> str:
    """The scope a request needs; any key for a path no route has (the app answers it 404 or 405)."""
    for route_method, pattern, needed in table:
        if route_method == method and pattern.match(path):
            return needed
    return ANY_KEY


class AccessMiddleware:
    """Authenticate (401), authorise by route (403) and rate-limit per key (429) before anything else runs."""

    def __init__(self, app: ASGIApp, *, keys: KeyRing, limiter: RateLimiter, routes: list[tuple[str, str]],
                 failed_auth: RateLimiter | None = None):
        self.app = app
        self.keys = keys
        self.limiter = limiter
        self.table = route_table(routes)
        self.failed_auth = failed_auth or RateLimiter(FAILED_AUTH_PER_S, FAILED_AUTH_BURST)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Paths are judged as the router matches them: without the root path an ASGI server puts in front
        # (uvicorn --root-path). On the raw path '/api/stats' matched no route, so it needed just any key.
        # get_route_path is Starlette's private helper, but the one FastAPI's router uses: they cannot disagree.
        if scope["type"] != "http" or get_route_path(scope) in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        key, refusal = self._authenticate(scope)
        if refusal is None:
            refusal = self._limit(scope, key)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        principal = ANONYMOUS if key is None else Principal(key.name, key.scopes, key.tenant)
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    def _authenticate(self, scope: Scope) -> tuple[ApiKey | None, Response | None]:
        """The caller's key (None on an open service), or the 401/403 that refuses the request."""
        if not self.keys.keys:
            return None, None
        address = f"client:{_client_address(scope)}"
        wait_s = self.failed_auth.wait_s(address)
        if wait_s > 0:
            retry_after = str(max(1, math.ceil(wait_s)))
            message = f"too many requests with a missing or wrong API key from this address: retry after {retry_after} s"
            return None, error_response(429, "rate_limited", message, headers={"Retry-After": retry_after})
        key = self.keys.find(_bearer(scope))
        if key is None:
            self.failed_auth.take(address)
            message = "missing or wrong API key: send 'Authorization: Bearer <key>'"
            return None, error_response(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})
        needed = required_scope(self.table, scope["method"], get_route_path(scope))
        if needed != ANY_KEY and needed not in key.scopes:
            message = f"this API key ({key.name}) lacks the '{needed}' scope that {scope['method']} {scope['path']} needs"
            return None, error_response(403, "forbidden", message)
        return key, None

    def _limit(self, scope: Scope, key: ApiKey | None) -> Response | None:
        """The 429 for a caller over its rate: a key's bucket, or on an open service one per client address."""
        if key is None:
            caller, name, rate, burst = f"client:{_client_address(scope)}", "this client", None, None
        else:
            caller, name, rate, burst = f"key:{key.name}", key.name, key.rate_limit_per_s, key.rate_limit_burst
        wait_s = self.limiter.take(caller, rate, burst)
        if wait_s <= 0:
            return None
        retry_after = str(max(1, math.ceil(wait_s)))
        message = f"rate limit of {name} exceeded: retry after {retry_after} s"
        return error_response(429, "rate_limited", message, headers={"Retry-After": retry_after})


def _client_address(scope: Scope) -> str:
    return str((scope.get("client") or ("unknown",))[0])


def _bearer(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1")
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


def principal_of(request) -> Principal:
    """Who sent ``request`` (set by ``AccessMiddleware``; everyone is anonymous on an open service)."""
    return getattr(request.state, "principal", ANONYMOUS)
