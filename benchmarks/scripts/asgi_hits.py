"""CPU per L1-hit request of the app itself: the ASGI app called directly, no server and no socket, 32 base64 L1
hits per request, its lifespan run as uvicorn runs it (benchmarks/notes/r5.md). An instant upstream is the
model, so nothing is computed after the first request.

    cd /tmp && /work/main/.venv/bin/python /work/main/benchmarks/scripts/asgi_hits.py          # PROFILE=tottime: a cProfile too
"""
import asyncio
import cProfile
import os
import pstats
import tempfile
import time

import orjson

from ragcache_testing.instant import InstantUpstream

NUM_REQUESTS = 2000


async def _one(app, scope: dict, body: bytes) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(dict(scope), receive, send)
    return sent


async def _run(app, model: str) -> None:
    body = orjson.dumps({"model": model, "input": [f"a repeated text {i}" for i in range(32)], "encoding_format": "base64"})
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000), "state": {}}
    inbox: asyncio.Queue = asyncio.Queue()
    outbox: asyncio.Queue = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, outbox.put))
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    first = await _one(app, scope, body)
    assert first[0]["status"] == 200
    for _ in range(200):
        await _one(app, scope, body)
    for _ in range(3):
        started = time.thread_time()
        for _ in range(NUM_REQUESTS):
            await _one(app, scope, body)
        print(f"L1 hit through the ASGI app: {1e6 * (time.thread_time() - started) / NUM_REQUESTS:.1f} us of CPU a request")
    if os.environ.get("PROFILE"):
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(NUM_REQUESTS):
            await _one(app, scope, body)
        profile.disable()
        pstats.Stats(profile).sort_stats(os.environ["PROFILE"]).print_stats(35)
    await inbox.put({"type": "lifespan.shutdown"})
    await outbox.get()
    await lifespan


def main() -> None:
    with InstantUpstream() as upstream:
        os.environ.update({"RAGCACHE_MODELS_JSON": upstream.models_json, "RAGCACHE_MODEL": upstream.model, "RAGCACHE_MILVUS_URI": "off",
                           "RAGCACHE_DRIFT_CHECK": "false", "RAGCACHE_REDIS_URL": "off", "RAGCACHE_DATA_DIR": tempfile.mkdtemp()})
        from ragcache_server.app import create_app

        asyncio.run(_run(create_app(), upstream.model))


if __name__ == "__main__":
    main()
