"""The FastAPI application: routes, error mapping, auth, and the lifespan that opens and flushes the cache.

    uvicorn services.app:create_app --factory        (or: ragcache serve)
"""

from __future__ import annotations

import hmac
import os
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import Depends, FastAPI, Request
from prometheus_client import CollectorRegistry

from ragcache.metrics import CacheCollector
from ragcache.prefixes.metrics import register_prefix_metrics
from ragcache.settings import Settings
from services import prefixes_api, routes_embed, routes_ops, routes_retrieval
from services.errors import HTTPError, install_error_handlers
from services.schemas import ERROR_RESPONSES
from services.state import ServiceState

OPEN_PATHS = {"/health", "/docs", "/openapi.json", "/redoc"}


def require_api_key(request: Request) -> None:
    """With ``api_key`` set, every route but the open ones needs ``Authorization: Bearer <key>``."""
    expected = request.app.state.settings.api_key
    if not expected or request.url.path in OPEN_PATHS:
        return
    given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", type="unauthorized")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.load()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = await to_thread.run_sync(ServiceState.open, settings)
        app.state.ragcache = state
        app.state.prefixes = state.prefixes
        app.state.metrics_registry.register(CacheCollector(lambda: state.caches.values()))
        register_prefix_metrics(state.prefixes, app.state.metrics_registry)
        try:
            yield
        finally:
            # Graceful shutdown: writes still queued for L2/L3 are flushed before the stores close.
            await to_thread.run_sync(state.close)

    app = FastAPI(
        title="ragcache",
        version="0.1.0",
        summary="A multi-level embedding cache and RAG retrieval service",
        lifespan=lifespan,
        dependencies=[Depends(require_api_key)],
    )
    app.state.settings = settings
    app.state.metrics_registry = CollectorRegistry()
    install_error_handlers(app)
    for module in (routes_embed, routes_retrieval, prefixes_api, routes_ops):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    return app


def app_from_environment() -> FastAPI:
    """The factory ``ragcache serve`` gives uvicorn: settings from RAGCACHE_* and the optional settings file."""
    return create_app(Settings.load(os.environ.get("RAGCACHE_SETTINGS_FILE")))
