"""HTTP routes of the KV-prefix registry; they only adapt :class:`ragcache.prefixes.PrefixRegistry`.

The app puts the registry at ``app.state.prefixes``. Requests and answers are the library's own frozen
dataclasses (FastAPI validates and serialises them), so the HTTP shape cannot drift from the library's.
Prefixes are per tenant, as collections are (ragcache_server/tenants.py): a tenant's ``system`` is stored as
``<tenant>--system``, every name in a request is mapped to the stored one and every name in an answer or
error back, so a tenant neither sees nor can name another tenant's prefix (404).
Library errors propagate to the app's error handlers (InvalidInputError -> 422, NotFoundError -> 404,
TierUnavailableError -> 503). The routes are plain ``def``: registering and warming wait on vLLM,
so they run in the thread pool, not the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from ragcache.prefixes import (
    Prefix,
    PrefixRegistry,
    PrefixSpec,
    PrefixStats,
    RegisterResult,
    WarmResult,
)
from ragcache.prefixes.model import MAX_USES_PER_REPORT
from ragcache.retrieval.names import public_name
from ragcache_server.auth import principal_of
from ragcache_server.deps import prefixes_of
from ragcache_server.tenants import public_names, stored_prefix

__all__ = ["router"]

router = APIRouter(prefix="/prefixes", tags=["prefixes"])


class UsesIn(BaseModel):
    count: int = Field(1, ge=0, le=MAX_USES_PER_REPORT, description="requests that used the prefix since the last report")


def _registry(request: Request) -> PrefixRegistry:
    return prefixes_of(request)


@contextmanager
def _stored(request: Request, name: str) -> Iterator[str]:
    """The stored name of the caller's prefix ``name``; errors inside name the public one."""
    stored = stored_prefix(principal_of(request).tenant, name)
    with public_names(stored, name):
        yield stored


def _public(item, name: str):
    """A library answer (a prefix, a warm, stats) under the name the caller knows."""
    return dataclasses.replace(item, name=name)


@router.post("", response_model=RegisterResult)
def register_prefix(spec: PrefixSpec, request: Request, response: Response) -> RegisterResult:
    """Register a prefix (a new version when its text changed) and warm it once when pinned.

    ``text`` is a system prompt, or (``is_template``) a template whose ``{slots}`` follow its constant head.
    """
    with _stored(request, spec.name) as stored:
        result = _registry(request).register(dataclasses.replace(spec, name=stored))
    response.status_code = 201 if result.created else 200
    return dataclasses.replace(
        result, prefix=_public(result.prefix, spec.name), warm=None if result.warm is None else _public(result.warm, spec.name),
        warms=tuple(_public(warm, spec.name) for warm in result.warms),
    )


@router.get("", response_model=list[Prefix])
def list_prefixes(request: Request) -> list[Prefix]:
    """The caller's tenant's prefixes, by name (every prefix, under its stored name, for a key without a tenant)."""
    tenant = principal_of(request).tenant
    own = [(prefix, public_name(tenant, prefix.name)) for prefix in _registry(request).list()]
    return [_public(prefix, name) for prefix, name in own if name is not None]


@router.get("/{name}", response_model=Prefix)
def get_prefix(name: str, request: Request) -> Prefix:
    """The stored prefix; its head (what every prompt starts with) is ``template_head(text, is_template)``."""
    with _stored(request, name) as stored:
        return _public(_registry(request).get(stored), name)


@router.delete("/{name}", status_code=204)
def delete_prefix(name: str, request: Request) -> Response:
    with _stored(request, name) as stored:
        _registry(request).delete(stored)
    return Response(status_code=204)


@router.post("/{name}/warm", response_model=WarmResult)
def warm_prefix(name: str, request: Request, endpoint: str | None = None) -> WarmResult:
    """Warm now on ``endpoint`` (default: the target), still within the warm budget and the endpoint's
    back-off: the outcome says which."""
    with _stored(request, name) as stored:
        return _public(_registry(request).warm(stored, endpoint), name)


@router.post("/{name}/uses", status_code=204)
def report_uses(name: str, body: UsesIn, request: Request) -> Response:
    """Clients report how many requests they built with this prefix (at most ``MAX_USES_PER_REPORT`` a call)."""
    with _stored(request, name) as stored:
        _registry(request).record_use(stored, body.count)
    return Response(status_code=204)


@router.get("/{name}/stats", response_model=PrefixStats)
def prefix_stats(name: str, request: Request) -> PrefixStats:
    """This replica's counters, summed and per vLLM endpoint (``endpoints``: residency as the last judged warm
    found it, last warm, evictions)."""
    with _stored(request, name) as stored:
        return _public(_registry(request).prefix_stats(stored), name)
