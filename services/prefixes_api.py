"""HTTP routes of the KV-prefix registry; they only adapt :class:`ragcache.prefixes.PrefixRegistry`.

The app puts the registry at ``app.state.prefixes``. Library errors propagate to the app's error
handlers (InvalidInputError -> 422, NotFoundError -> 404, TierUnavailableError -> 503). The routes are
plain ``def``: registering and warming wait on vLLM, so they run in the thread pool, not the loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from ragcache.prefixes import (
    Prefix,
    PrefixRegistry,
    PrefixSpec,
    PromptForm,
    RegistryStats,
    Target,
    WarmOutcome,
    template_head,
)

__all__ = ["router", "RegistryStatsOut", "registry_stats_out"]

router = APIRouter(prefix="/prefixes", tags=["prefixes"])


class TargetModel(BaseModel):
    base_url: str = Field(description="vLLM OpenAI-compatible base URL, without /v1")
    model: str = Field(description="served model name")


class PrefixCreate(BaseModel):
    name: str
    text: str = Field(description="a system prompt, or a template whose {slots} follow its constant head")
    target: TargetModel
    is_template: bool = False
    form: PromptForm = PromptForm.COMPLETION
    lmcache_controller_url: str | None = None
    pinned: bool = True


class PrefixOut(BaseModel):
    name: str
    text: str
    head: str = Field(description="the constant text every request starts with (what is kept warm)")
    target: TargetModel
    is_template: bool
    form: PromptForm
    lmcache_controller_url: str | None
    pinned: bool
    version: int
    num_tokens: int | None
    content_hash: str
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, prefix: Prefix) -> PrefixOut:
        data = prefix.to_json()
        return cls(**data, head=template_head(prefix.text, prefix.is_template))


class WarmOut(BaseModel):
    name: str
    version: int
    outcome: WarmOutcome
    num_prompt_tokens: int
    num_cached_tokens: int
    latency_s: float
    error: str | None


class RegisterOut(BaseModel):
    prefix: PrefixOut
    created: bool
    new_version: bool
    warnings: list[str]
    warm: WarmOut | None


class PrefixStatsOut(BaseModel):
    name: str
    version: int
    num_tokens: int | None
    pinned: bool
    num_warms: int
    num_resident: int
    num_evicted: int
    num_errors: int
    num_skipped: int
    residency_rate: float | None
    last_outcome: WarmOutcome | None
    last_warm_at: float | None
    rewarm_interval_s: float
    num_uses: int
    lmcache_pinned_tokens: int | None


class TargetStatsOut(BaseModel):
    base_url: str
    up: bool
    num_failures: int
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    prefix_cache_hit_rate: float | None
    block_size: int | None


class RegistryStatsOut(BaseModel):
    """The prefix section of ``/stats``."""

    prefixes: list[PrefixStatsOut]
    targets: list[TargetStatsOut]
    num_warms_sent: int
    num_warms_deferred: int


class UsesIn(BaseModel):
    count: int = Field(1, ge=0, description="requests that used the prefix since the last report")


def registry_stats_out(stats: RegistryStats) -> RegistryStatsOut:
    """Convert the library's stats snapshot for JSON (also what the app's ``/stats`` embeds)."""
    return RegistryStatsOut(
        prefixes=[PrefixStatsOut(**dataclasses.asdict(p)) for p in stats.prefixes],
        targets=[TargetStatsOut(**dataclasses.asdict(t), prefix_cache_hit_rate=t.prefix_cache_hit_rate)
                 for t in stats.targets],
        num_warms_sent=stats.num_warms_sent,
        num_warms_deferred=stats.num_warms_deferred,
    )


def _registry(request: Request) -> PrefixRegistry:
    return request.app.state.prefixes


def _warm_out(result: Any) -> WarmOut | None:
    return None if result is None else WarmOut(**dataclasses.asdict(result))


@router.post("", response_model=RegisterOut)
def register_prefix(body: PrefixCreate, request: Request, response: Response) -> RegisterOut:
    """Register a prefix (a new version when its text changed) and warm it once when pinned."""
    spec = PrefixSpec(name=body.name, text=body.text, target=Target(body.target.base_url, body.target.model),
                      is_template=body.is_template, form=body.form,
                      lmcache_controller_url=body.lmcache_controller_url, pinned=body.pinned)
    result = _registry(request).register(spec)
    response.status_code = 201 if result.created else 200
    return RegisterOut(prefix=PrefixOut.of(result.prefix), created=result.created,
                       new_version=result.new_version, warnings=list(result.warnings), warm=_warm_out(result.warm))


@router.get("", response_model=list[PrefixOut])
def list_prefixes(request: Request) -> list[PrefixOut]:
    return [PrefixOut.of(p) for p in _registry(request).list()]


@router.get("/{name}", response_model=PrefixOut)
def get_prefix(name: str, request: Request) -> PrefixOut:
    return PrefixOut.of(_registry(request).get(name))


@router.delete("/{name}", status_code=204)
def delete_prefix(name: str, request: Request) -> Response:
    _registry(request).delete(name)
    return Response(status_code=204)


@router.post("/{name}/warm", response_model=WarmOut)
def warm_prefix(name: str, request: Request) -> WarmOut:
    """Warm now (still within the warm budget and the target's back-off: the outcome says which)."""
    return _warm_out(_registry(request).warm(name))


@router.post("/{name}/uses", status_code=204)
def report_uses(name: str, body: UsesIn, request: Request) -> Response:
    """Clients report how many requests they built with this prefix."""
    _registry(request).record_use(name, body.count)
    return Response(status_code=204)


@router.get("/{name}/stats", response_model=PrefixStatsOut)
def prefix_stats(name: str, request: Request) -> PrefixStatsOut:
    return PrefixStatsOut(**dataclasses.asdict(_registry(request).prefix_stats(name)))
