"""The FastAPI application: routes, error mapping, auth, and the lifespan that opens and flushes the cache.

    uvicorn ragcache_server.app:create_app --factory        (or: ragcache serve)
"""

from __future__ import annotations

import gc
import os
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from ragcache.app import CacheCollector, DriftCollector, ServerRestartsCollector, retain_freed_memory, torch_threads
from ragcache.models import UpstreamCollector
from ragcache.prefixes import register_prefix_metrics
from ragcache.settings import Settings
from ragcache_server import embedding, prefixes_api, routes_docs, routes_ops, routes_rerank, routes_retrieval, routes_ui, start_logs
from ragcache_server.auth import OPEN_PATHS, AccessMiddleware, KeyRing
from ragcache_server.deps import blocking
from ragcache_server.embedding import MAX_GROUP_TEXTS, EmbedFastPath, EmbedGroups, FastPathCounts
from ragcache_server.error_shapes import ErrorShapes
from ragcache_server.errors import install_error_handlers
from ragcache_server.limits import LimitsMiddleware, RateLimiter
from ragcache_server.probes import LevelProbes
from ragcache_server.schemas import ERROR_RESPONSES, bounded_to_service
from ragcache_server.state import ServiceState, TenantCaches, local_models
from ragcache_server.tracing import TracingMiddleware
from ragcache_server.workers import WorkerPool


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.load()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        start_logs.install()  # a start-up error in one line, dependencies' harmless warnings quiet (start_logs.py)
        retain_freed_memory(settings.service.malloc_retain_bytes)  # before the model loads: its allocations too
        # Before any worker thread: each takes torch's thread count when it first runs an operation.
        any_local_model = bool(local_models(settings) or settings.rerank.rerank_models)
        with torch_threads(settings.service.torch_threads, any_local_model=any_local_model):
            state = await to_thread.run_sync(ServiceState.open, settings)
            # Each level probed before the first request and every few seconds after: /health says what is (probes.py).
            probes = await to_thread.run_sync(LevelProbes(lambda: state.caches.values()).start)
            app.state.ragcache = state
            app.state.prefixes = state.prefixes
            app.state.tenant_caches = TenantCaches(state, enabled=settings.access.tenant_cache_namespaces)
            # Rerank score caches count like the models' (their model label names the reranker; a "text" is a pair).
            rerank_caches = [reranker.cache for reranker in state.rerankers.values()]
            app.state.metrics_registry.register(
                CacheCollector(lambda: [*state.caches.values(), *rerank_caches])
            )
            register_prefix_metrics(state.prefixes, app.state.metrics_registry)
            app.state.metrics_registry.register(DriftCollector(lambda: state.drift.states() if state.drift else []))
            app.state.metrics_registry.register(UpstreamCollector(lambda: state.caches.items()))
            app.state.metrics_registry.register(ServerRestartsCollector(state.stores.server_restarts))
            # What start-up made (the model, its tokenizer, the libraries: ~500,000 objects with the default model)
            # lives as long as the service: out of the cyclic collector's sight, a full collection scans only what
            # requests made since. Each full collection scanned them all, 277-289 ms with the event loop stopped
            # (benchmarks/notes/r7.md). Thawed at shutdown, so that an app started and stopped inside a longer
            # process (a test, an embedding script) leaves nothing frozen behind it.
            gc.freeze()
            try:
                yield
            finally:
                gc.unfreeze()
                await to_thread.run_sync(probes.stop)
                # Graceful shutdown: writes still queued for L2/L3 are flushed before the stores close.
                await to_thread.run_sync(state.close)

    app = FastAPI(
        title="ragcache",
        version="0.1.0",
        summary="A multi-level embedding cache and RAG retrieval service",
        lifespan=lifespan,
        # /docs is served from local files under a strict CSP (ragcache_server/routes_docs.py), not FastAPI's
        # CDN page; no ReDoc.
        docs_url=None,
        redoc_url=None,
        # FastAPI's own OpenTelemetry hooks asked the environment for a tracer, meter and logger provider on every
        # request (~3% of an L1 hit's CPU); the service's spans are TracingMiddleware's (RAGCACHE_TRACING).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.metrics_registry = CollectorRegistry()
    install_error_handlers(app)
    routers = [module.router for module in (embedding, routes_retrieval, routes_rerank, prefixes_api, routes_ops, routes_ui,
                                                 routes_docs)]
    for router in routers:
        # The embedding routes name their own error bodies, OpenAI's and TEI's (ragcache_server/error_shapes.py).
        app.include_router(router, responses=None if router is embedding.router else ERROR_RESPONSES)
    app.openapi = _bounded_openapi(app, settings)  # type: ignore[method-assign]
    # The last added runs first: keys and rate limits are checked before a body is read (docs/SECURITY.md).
    app.state.workers = WorkerPool(settings.service.max_worker_threads)
    # Innermost: the embedding routes' fast path answers inside every check below (embedding/answers.py).
    app.state.embed_fast_path = FastPathCounts()
    # Requests that miss L1 together, walked together; a group never holds more texts than the model's queue may
    # (compute_max_pending: one request larger than that is still walked, alone, as before).
    app.state.embed_groups = EmbedGroups(blocking, max_group_texts=min(MAX_GROUP_TEXTS, settings.compute.compute_max_pending))
    app.add_middleware(EmbedFastPath, answer=embedding.answer, error_handlers=lambda: app.exception_handlers,
                       counts=app.state.embed_fast_path)
    app.add_middleware(LimitsMiddleware, max_body_bytes=settings.service.max_body_bytes, timeout_s=settings.service.request_timeout_s,
                       body_timeout_s=settings.service.body_timeout_s, untimed_paths=OPEN_PATHS, workers=app.state.workers)
    limiter = RateLimiter(settings.access.rate_limit_per_s, settings.access.rate_limit_burst)
    # From the routers, not the OpenAPI schema: a route left out of the docs (include_in_schema=False) still
    # gets its scope, or admin when unlisted, instead of being open to any key.
    routes = [(method, route.path) for router in routers for route in router.routes for method in route.methods]
    app.add_middleware(AccessMiddleware, keys=KeyRing.from_settings(settings), limiter=limiter, routes=routes)
    # Outside every check that answers an error: OpenAI's and TEI's routes answer theirs in their shapes.
    app.add_middleware(ErrorShapes)
    # Outermost: a request's span (RAGCACHE_TRACING) covers the refusals above as well. Only with tracing on: off,
    # the stores hold no tracer (Tracing.configured), and the layer would only look that up on every request.
    if settings.service.tracing != "off":
        app.add_middleware(TracingMiddleware)
    return app


def _bounded_openapi(app: FastAPI, settings: Settings):
    """``app.openapi`` with this service's bounds in the schema (``schemas.bounded_to_service``): what it allows is
    what the service serves. Made once the models are loaded (the first /openapi.json), for their vocabularies."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        state: ServiceState | None = getattr(app.state, "ragcache", None)
        if state is None:
            schema = bounded_to_service(generate(), max_batch=settings.service.max_batch)
        else:
            schema = bounded_to_service(
                generate(), max_batch=settings.service.max_batch, max_token_id=_last_token_id(state),
                prompt_names={name for prompts in state.prompts.values() for name in prompts},
                dimensions={cache.space.dim for cache in state.caches.values()}, rerankers=bool(state.rerankers))
        if state is None:  # asked before start-up (a test): not kept, the vocabularies are not known yet
            app.openapi_schema = None
        return schema

    return openapi


def _last_token_id(state: ServiceState) -> int | None:
    """The last token id every served local model's tokenizer knows (None: none known)."""
    sizes = [len(tokenizer) for cache in state.caches.values()
             if (tokenizer := getattr(cache.encoder, "tokenizer", None)) is not None]  # a local model's own tokenizer
    return min(sizes) - 1 if sizes else None


def app_from_environment() -> FastAPI:
    """The factory ``ragcache serve`` gives uvicorn: settings from RAGCACHE_* and the optional settings file."""
    return create_app(Settings.load(os.environ.get("RAGCACHE_SETTINGS_FILE")))
