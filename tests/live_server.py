"""Run the real app under uvicorn on a free loopback port, in a thread, for tests over real HTTP; or hand
``ragcache.client.Client``'s requests to an app in this process (``transport_to``)."""

from __future__ import annotations

import threading
import time

import httpx
import uvicorn

from ragcache.settings import Settings
from ragcache.storage.embedded_redis import free_port
from ragcache_server.app import create_app
from ragcache_server.serving import ServeConfig, bounds_of


def transport_to(test_client) -> httpx.MockTransport:
    """A transport that hands each request of ``ragcache.client.Client`` to the app behind a Starlette
    ``TestClient`` (the sync client builds its own ``httpx.Client``; this is its seam to an in-process app)."""

    def forward(request: httpx.Request) -> httpx.Response:
        answer = test_client.request(request.method, request.url.raw_path.decode("ascii"), content=request.content,
                                     headers=dict(request.headers))
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    return httpx.MockTransport(forward)


class LiveServer:
    def __init__(self, settings: Settings):
        self.app = create_app(settings)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # timeout_keep_alive as `ragcache serve` sets it: with uvicorn's 5 s, a loaded test client reusing an idle
        # connection just as the server closes it gets a ReadError that says nothing about the service.
        # The protocol and bounds of `ragcache serve` too (ragcache_server/serving.py: header deadline, connection bound).
        config = ServeConfig(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                             timeout_keep_alive=75, **bounds_of(settings.service, settings.access))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if not self.thread.is_alive():
                raise RuntimeError("the server thread died while starting")
            time.sleep(0.1)
        raise RuntimeError("the server did not start in time")

    @property
    def state(self):
        return self.app.state.ragcache

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def __exit__(self, *exc_info) -> None:
        self.stop()
