"""Operations: /stats (hit rates), /metrics (Prometheus), /health and /info."""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import asdict, replace

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

import ragcache
from ragcache.core import Scope
from ragcache.models import DriftState, upstream_figures
from ragcache.observe import implementations, redact_url
from ragcache.retrieval import own_named
from ragcache_server.auth import principal_of
from ragcache_server.deps import metrics_registry_of, state_of
from ragcache_server.errors import error_response
from ragcache_server.responses import JSONResponse
from ragcache_server.state import ServiceState

router = APIRouter(tags=["operations"])


@router.get("/stats", summary="Hit rates per level and per model, since start and over the recent window")
async def stats(request: Request) -> JSONResponse:
    state = state_of(request)
    tenant = principal_of(request).tenant
    if tenant is not None:
        return JSONResponse(_tenant_stats(state, tenant))
    drift = _drift_of(state)
    models = {
        name: {
            "space": cache.space.describe(),
            "levels": cache.level_states(),
            "pending_writes": cache.pending_writes,
            "since_start": asdict(cache.stats()),
            "recent": asdict(cache.stats(recent=True)),
            "drift": drift.get(name),
            # Each tenant's key namespace (tenant_cache_namespaces): its share of the figures above.
            "namespaces": _namespaces_of(cache),
            **_upstream_of(cache),
            # The model under each named prompt used so far (ragcache.models.prompts): its space, its share of the figures above.
            "prompts": _prompts_of(state, name, cache),
        }
        for name, cache in state.caches.items()
    }
    # Rerank scores are cached like vectors (ragcache.rerank.scores): the same figures, per reranker.
    rerankers = {
        name: {
            "space": reranker.cache.space.describe(),
            "levels": reranker.cache.level_states(),
            "since_start": asdict(reranker.cache.stats()),
            "recent": asdict(reranker.cache.stats(recent=True)),
            **_remote_reranker_of(reranker.reranker),
        }
        for name, reranker in state.rerankers.items()
    }
    return JSONResponse({"models": models, "rerankers": rerankers, "prefixes": _prefixes_of(state, principal_of(request).tenant),
                         # Times each embedded server died and was started again (ragcache.storage.supervision).
                         "embedded_restarts": state.stores.server_restarts()})


def _tenant_stats(state: ServiceState, tenant: str) -> dict:
    """/stats for a tenant's admin key: that tenant's own figures only. The models' totals, their level states and
    the other tenants' namespaces count everyone's traffic, and watching them would tell one tenant what another
    embeds; they are the operator's (a key without a tenant), like /metrics."""
    models = {}
    for name, cache in state.caches.items():
        since_start, recent = cache.namespace_stats(), cache.namespace_stats(recent=True)
        own = since_start.get(tenant)
        models[name] = {"tenant": tenant, "since_start": asdict(own) if own is not None else None,
                        "recent": asdict(recent[tenant]) if tenant in recent else None}
    return {"models": models, "rerankers": {}, "prefixes": _prefixes_of(state, tenant)}


def _prefixes_of(state: ServiceState, tenant: str | None) -> dict:
    """The prefix registry's figures; a tenant's admin key reads its own prefixes only, under their public names."""
    stats = state.prefixes.stats()
    return asdict(replace(stats, prefixes=tuple(own_named(tenant, stats.prefixes))))


def _upstream_of(cache) -> dict:
    """A remote model's ``upstream`` entry (calls, tokens, retries, errors, latency, savings); none for a local one."""
    figures = upstream_figures(cache.encoder.stats(), cache.stats().hits)
    return {} if figures is None else {"upstream": figures}


def _remote_reranker_of(reranker) -> dict:
    """A remote reranker's breaker (up, or down since when and why); none for a local cross-encoder."""
    health = getattr(reranker, "health", None)
    if health is None:
        return {}
    down = health.is_down
    return {"remote": {"up": not down, "last_error": health.last_error if down else None,
                       "num_outages": health.num_outages, "down_for_s": health.down_for_s()}}


@router.get("/metrics", summary="Prometheus exposition", response_class=Response)
async def metrics(request: Request) -> Response:
    if principal_of(request).tenant is not None:
        # Every series counts every tenant's traffic (see _tenant_stats): Prometheus scrapes with the operator's key.
        return error_response(403, "forbidden", "/metrics counts every tenant's traffic: it needs an admin key without a "
                              "tenant (a tenant's own figures are in /stats)")
    return Response(generate_latest(metrics_registry_of(request)), media_type=CONTENT_TYPE_LATEST)


@router.get("/health", summary="ok, or degraded while a level is down (the service still answers); each level's state "
            "as last probed")
async def health(request: Request) -> JSONResponse:
    state = state_of(request)
    levels = _level_health(state)
    down = sorted(name for name, level in levels.items() if not level["up"])
    # Per model: stable, changed (the model behind the name changed and a new space generation is served;
    # the service is fine), or check_failing (the canaries could not be checked; the last generation stays).
    # No error text: /health is open, and an error may name a host (/stats, admin only, has it).
    drift = {
        name: {"status": s.status, "generation": s.generation, "num_drift_events": s.num_drift_events,
               "last_drift_at": s.last_drift_at}
        for name, s in _drift_states(state).items()
    }
    return JSONResponse({"status": "degraded" if down else "ok", "levels_down": down, "levels": levels, "drift": drift})


def _level_health(state: ServiceState) -> dict[str, dict]:
    """Each level by name, over every model's cache (the stores are shared): up only if up for all, and how long ago
    it was last probed (the service probes every level at start and every few seconds: ragcache_server/probes.py)."""
    levels: dict[str, dict] = {}
    for cache in state.caches.values():
        for name, s in cache.level_states().items():
            level = levels.setdefault(name, {"up": True, "probed_s_ago": s.get("probed_s_ago")})
            level["up"] = level["up"] and s["up"]
            if s.get("probed_s_ago") is not None and (level["probed_s_ago"] or 0) < s["probed_s_ago"]:
                level["probed_s_ago"] = s["probed_s_ago"]
    return levels


def _drift_states(state: ServiceState) -> dict[str, DriftState]:
    return {s.model: s for s in state.drift.states()} if state.drift is not None else {}


def _drift_of(state: ServiceState) -> dict[str, dict]:
    """Each model's drift check, for /stats (``ragcache.models.drift.DriftState`` plus its status)."""
    return {name: {**asdict(s), "status": s.status} for name, s in _drift_states(state).items()}


@router.get("/info", summary="Models and dimensions; for an admin key also levels, settings and versions")
async def info(request: Request) -> JSONResponse:
    state = state_of(request)
    models = [
        {"name": name, "dim": cache.space.dim, "dtype": cache.space.dtype, "prompts": state.prompts_of(name)}
        for name, cache in state.caches.items()
    ]
    if "admin" not in principal_of(request).scopes:
        # Any key may call /info to learn what it can embed with; level states, raw errors, L1 usage and
        # where the stores are belong to the operator (an error may name a host, a URI its credentials).
        return JSONResponse({"default_model": state.default_model, "models": models})
    return JSONResponse(_admin_info(state, models))


def _admin_info(state: ServiceState, models: list[dict]) -> dict:
    import fastapi
    import pymilvus
    import redis
    import torch

    for model, cache in zip(models, state.caches.values()):
        model.update(
            max_seq_length=cache.space.max_seq_length,
            space=cache.space.describe(),
            device=str(cache.device),
            levels=cache.level_states(),
        )
    return {
        "default_model": state.default_model,
        "models": models,
        "settings": {
            "max_batch": state.settings.service.max_batch,
            "truncate": state.settings.service.truncate,
            "l1_bytes": state.settings.levels.l1_bytes,
            "disk": str(state.stores.disk.root) if state.stores.disk is not None else "off",
            "disk_max_bytes": state.settings.levels.disk_max_bytes,
            "l3_admission": _l3_admission(state),
            "redis": "embedded" if state.stores.embedded_redis else ("off" if state.stores.redis is None else "external"),
            # Redacted: a URI may carry a user and password (ragcache.observe.redact).
            "milvus": redact_url(uri) if (uri := state.settings.levels.resolved_milvus_uri) else "off",
        },
        # Which implementation of each C/Python pair serves: "python" means an install without a C compiler.
        "implementations": implementations(),
        "versions": {
            "ragcache": ragcache.__version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            # From the package metadata: importing it takes ~8 s, and a service of remote models never needs it.
            "sentence_transformers": importlib.metadata.version("sentence-transformers"),
            "redis_py": redis.__version__,
            "pymilvus": pymilvus.__version__,
            "fastapi": fastapi.__version__,
        },
    }


def _l3_admission(state: ServiceState) -> str:
    """Which vectors L3 takes: "reuse" (those that proved reuse), "all", or "off" when the service has no L3 (the
    setting then rules nothing, and saying "reuse" would suggest a level that is not there)."""
    if state.stores.milvus is None:
        return "off"
    return "reuse" if state.settings.levels.l3_on_reuse else "all"


def _prompts_of(state: ServiceState, model: str, cache) -> dict[str, dict]:
    since_start, recent = cache.prompt_stats(), cache.prompt_stats(recent=True)
    return {name: {"space": cache.space_in(Scope(prompt=state.prompts[model][name])).describe(), "since_start": asdict(figures),
                   "recent": asdict(recent[name]) if name in recent else None}
            for name, figures in since_start.items()}


def _namespaces_of(cache) -> dict[str, dict]:
    since_start, recent = cache.namespace_stats(), cache.namespace_stats(recent=True)
    return {name: {"since_start": asdict(figures), "recent": asdict(recent[name]) if name in recent else None}
            for name, figures in since_start.items()}
