"""The service with one more route, for ``ragcache bench http``: the floor of HTTP + JSON in this process.

``PUT /bench/floor`` stores response bytes; ``POST /bench/floor`` reads the request body and answers those
bytes, precomputed. Served by the same uvicorn, middleware (keys, limits, deadline) and event loop as the
real routes, so an ``/embed`` answered from L1 can be timed against the least any route here can cost: the
difference is the cache's own work (lookup, gather, serialisation) and nothing else.

    uvicorn ragcache_bench.floor_app:create_bench_app --factory      (what the bench's ServiceProcess starts)

Not part of ``ragcache serve``: a deployment never has this route.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, Response

from ragcache_server.app import app_from_environment

__all__ = ["create_bench_app"]

FLOOR_PATH = "/bench/floor"


def create_bench_app() -> FastAPI:
    app = app_from_environment()
    stored: dict[str, bytes] = {"body": b"[]"}

    @app.put(FLOOR_PATH, include_in_schema=False)
    async def store_floor(request: Request) -> Response:
        stored["body"] = await request.body()
        return Response(status_code=204)

    @app.post(FLOOR_PATH, include_in_schema=False)
    async def floor(request: Request) -> Response:
        await request.body()
        return Response(stored["body"], media_type="application/json")

    return app
