"""HTTP routes of the KV-prefix registry; they only adapt :class:`ragcache.prefixes.PrefixRegistry`.

The app puts the registry at ``app.state.prefixes``. Requests and answers are the library's own frozen
dataclasses (FastAPI validates and serialises them), so the HTTP shape cannot drift from the library's.
Prefixes are per tenant, as collections are (ragcache_server/state.py, TenantCaches): a tenant's ``system`` is stored as
``<tenant>--system``: each name in a request is the caller's ``PrefixName`` (``ragcache.retrieval.names``), and the
registry's answers and errors carry its public name, so a tenant neither sees nor can name another tenant's
prefix (404), nor reads a stored name.
Library errors propagate to the app's error handlers (InvalidInputError -> 422, NotFoundError -> 404,
TierUnavailableError -> 503). The routes are plain ``def``: registering and warming wait on vLLM,
so they run in the thread pool, not the loop.
"""

from __future__ import annotations

import math

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from ragcache.prefixes import (
    MAX_USES_PER_REPORT,
    Prefix,
    PrefixLimitError,
    PrefixName,
    PrefixRegistry,
    PrefixSpec,
    PrefixStats,
    PrefixView,
    RegisterResult,
    RouteResult,
    WarmResult,
)
from ragcache.retrieval import own_named
from ragcache_server.auth import principal_of
from ragcache_server.deps import prefixes_of
from ragcache_server.errors import error_response

__all__ = ["router"]

router = APIRouter(prefix="/prefixes", tags=["prefixes"])


class UsesIn(BaseModel):
    count: int = Field(1, ge=0, le=MAX_USES_PER_REPORT, description="requests that used the prefix since the last report")


def _registry(request: Request) -> PrefixRegistry:
    return prefixes_of(request)


def _name(request: Request, name: str) -> PrefixName:
    """The caller's prefix ``name`` (its tenant's): the registry's errors and answers name it so."""
    return PrefixName.of(name, principal_of(request).tenant)


# A registration over one of the registry's bounds (ragcache/prefixes/quota.py, docs/SECURITY.md): its status.
LIMIT_STATUS = {"too_large": 413, "quota_exceeded": 403, "rate_limited": 429}


@router.post("", response_model=RegisterResult)
def register_prefix(spec: PrefixSpec, request: Request, response: Response) -> RegisterResult | Response:
    """Register a prefix (a new version when its text changed) and warm it once when pinned.

    ``text`` is a system prompt, or (``is_template``) a template whose ``{slots}`` follow its constant head.
    Over a bound: 413 (the text), 403 ``quota_exceeded`` (the tenant's prefixes), 429 with ``Retry-After``
    (registrations this minute).
    """
    try:
        result = _registry(request).register(spec, tenant=principal_of(request).tenant)
    except PrefixLimitError as exc:
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))} if exc.retry_after_s is not None else None
        return error_response(LIMIT_STATUS[exc.kind], exc.kind, str(exc), exc.field, headers)
    response.status_code = 201 if result.created else 200
    return result


@router.get("", response_model=list[Prefix])
def list_prefixes(request: Request) -> list[Prefix]:
    """The caller's tenant's prefixes, by name (every prefix, under its stored name, for a key without a tenant)."""
    return own_named(principal_of(request).tenant, _registry(request).list())


@router.get("/{name}", response_model=PrefixView)
def get_prefix(name: str, request: Request) -> PrefixView:
    """The stored prefix; its head (what every prompt starts with) is ``template_head(text, is_template)``.
    ``residency``: per endpoint, how many of its KV blocks the engine holds by its KV events (issue 30)."""
    return _registry(request).view(_name(request, name))


@router.delete("/{name}", status_code=204)
def delete_prefix(name: str, request: Request) -> Response:
    _registry(request).delete(_name(request, name))
    return Response(status_code=204)


@router.post("/{name}/warm", response_model=WarmResult)
def warm_prefix(name: str, request: Request, endpoint: str | None = None) -> WarmResult:
    """Warm now on ``endpoint`` (default: the target), still within the warm budget and the endpoint's
    back-off: the outcome says which."""
    return _registry(request).warm(_name(request, name), endpoint)


@router.post("/{name}/uses", status_code=204)
def report_uses(name: str, body: UsesIn, request: Request) -> Response:
    """Clients report how many requests they built with this prefix (at most ``MAX_USES_PER_REPORT`` a call)."""
    _registry(request).record_use(_name(request, name), body.count)
    return Response(status_code=204)


@router.post("/{name}/route", response_model=RouteResult)
def route_prefix(name: str, request: Request) -> RouteResult:
    """The vLLM endpoint a request starting with this prefix should go to: the replica holding most of its KV blocks by
    the engines' events (the least loaded among equals), else the least loaded, else the next in turn (``reason``).
    A tenant's key reads the endpoint and the reason only: ``candidates`` (every replica's blocks of the other
    prefixes, its total blocks and load) is the fleet's, shown to keys without a tenant."""
    tenant = principal_of(request).tenant
    result = _registry(request).route(_name(request, name))
    return result if tenant is None else result.brief()


@router.get("/{name}/stats", response_model=PrefixStats)
def prefix_stats(name: str, request: Request) -> PrefixStats:
    """This replica's counters, summed and per vLLM endpoint (``endpoints``: residency as the last judged warm
    found it, last warm, evictions)."""
    return _registry(request).prefix_stats(_name(request, name))
