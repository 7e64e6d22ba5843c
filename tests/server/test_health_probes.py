"""A truthful /health: every level probed at start and every few seconds, so a Redis unreachable from the start is
``degraded`` before any request, and its return is seen without one."""

from __future__ import annotations

import time

import httpx

from ragcache.settings import Settings
from tests.live_server import LiveServer
from tests.tcp_proxy import TcpProxy


def wait_for_status(url: str, status: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = httpx.get(url + "/health", timeout=10).json()
        if answer["status"] == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_redis_unreachable_at_start_is_degraded_before_the_first_request_and_back_without_one(redis_server, tmp_path):
    host, port = redis_server.removeprefix("redis://").split("/")[0].split(":")
    proxy = TcpProxy(host, int(port))
    proxy.cut()  # Redis unreachable from the start
    settings = Settings(redis_url=proxy.url(), milvus_uri="off", data_dir=tmp_path, redis_timeout_s=0.5)
    try:
        with LiveServer(settings) as live:
            # The server's own start-up wait asked /health only: no embedding request has touched L2.
            first = httpx.get(live.url + "/health").json()
            assert first["status"] == "degraded" and first["levels_down"] == ["L2"]
            assert first["levels"]["L2"]["up"] is False and first["levels"]["L2"]["probed_s_ago"] is not None
            assert first["levels"]["L1"]["up"] is True
            assert "error" not in str(first["levels"])  # /health is open: no error text, which may name a host
            proxy.restore()
            back = wait_for_status(live.url, "ok")
            assert back["status"] == "ok" and back["levels_down"] == [] and back["levels"]["L2"]["up"] is True
    finally:
        proxy.close()
