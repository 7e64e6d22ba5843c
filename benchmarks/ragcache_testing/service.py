"""The real service as a subprocess (``ragcache serve``, one worker unless asked), for the tests and the benchmarks.

The service gets its own data folder, and the caller's Redis as L2, so a bench can make vectors resident in L2
for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from ragcache.storage.processes import free_port, stop_process, wait_healthy

__all__ = ["ServiceProcess", "served", "LEVELS"]

LEVELS = ("L1", "Disk", "L2", "L3", "Compute")  # the X-Cache-* headers (docs/levels.md: how the levels are named)


def served(response) -> dict[str, int]:
    """How many inputs of an /embed response each level served (its ``X-Cache-*`` headers)."""
    return {level: int(response.headers.get(f"x-cache-{level.lower()}", 0)) for level in LEVELS}


class ServiceProcess:
    def __init__(
        self,
        workdir: Path,
        *,
        redis_url: str | None,
        extra_env: dict[str, str] | None = None,
        timeout_s: float = 180.0,
        log_level: str = "warning",
        workers: int = 1,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data_dir = workdir / f"service-{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "RAGCACHE_DATA_DIR": str(data_dir),
            "RAGCACHE_REDIS_URL": redis_url or "",
            **(extra_env or {}),
        }
        if redis_url is None:
            del env["RAGCACHE_REDIS_URL"]  # the service starts its own embedded Redis, as `make serve` does
        self.log_path = data_dir / "service.log"
        self._log = self.log_path.open("wb")
        # `ragcache serve`'s server and settings, with the app that adds the bench's floor route (benchmarks/ragcache_bench/floor_app.py).
        serve = "\n".join([
            "from ragcache_cli.cli import SERVE_OPTIONS, shared_embedded_stores",
            "from ragcache.settings import Settings",
            "from ragcache_server.serving import ServeConfig, bounds_of, run_server",
            "settings = Settings.load()",
            # Several workers share one embedded Redis and one Milvus Lite server, started here as `ragcache serve` does.
            f"with shared_embedded_stores(settings, {workers}):",
            "    run_server(ServeConfig('ragcache_bench.floor_app:create_bench_app', factory=True, host='127.0.0.1', "
            f"port={self.port}, workers={workers}, log_level={log_level!r}, **bounds_of(settings.service, settings.access), "
            "**SERVE_OPTIONS))",
        ])
        command = [sys.executable, "-c", serve]
        self.process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=120.0)
        self._wait_healthy(timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        try:
            wait_healthy(self.process, f"{self.url}/health", name="the service", timeout_s=timeout_s,
                         interval_s=0.25, log_tail=self.log_tail)
        except RuntimeError:
            self.stop()
            raise

    def log_tail(self, num_chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def post(self, path: str, body: dict) -> httpx.Response:
        response = self.client.post(path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"POST {path} -> {response.status_code}: {response.text[:500]}")
        return response

    def stop(self) -> None:
        self.client.close()
        stop_process(self.process, timeout_s=40)
        self._log.close()
