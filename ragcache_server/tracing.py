"""A span per HTTP request (OpenTelemetry), the parent of the cache's spans, when ``RAGCACHE_TRACING`` is on.

The tracer is the one the service's stores opened (``ragcache.observe.tracing``); with tracing off the app does not
install this middleware at all (``ragcache_server/app.py``). Worker threads (``blocking``) inherit the request's context,
so the cache's ``ragcache.embed`` / ``ragcache.lookup`` / ``ragcache.compute`` spans nest under it.
"""

from __future__ import annotations

from starlette._utils import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["TracingMiddleware"]


class TracingMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = getattr(scope.get("app"), "state", None)
        service = getattr(state, "ragcache", None)
        tracer = service.stores.tracing.tracer if service is not None else None
        if scope["type"] != "http" or tracer is None:
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        path = get_route_path(scope)
        attributes = {"http.request.method": scope["method"], "url.path": path}
        with tracer.start_as_current_span(f"{scope['method']} {path}", kind=SpanKind.SERVER, attributes=attributes) as span:

            async def send_with_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                    if message["status"] >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, send_with_status)
