"""The real service as a subprocess (``ragcache serve``, one worker) and the load generator that drives it.

The service gets its own data folder, and the bench process's Redis as L2, so the bench can make vectors
resident in L2 for it. The load generator is asyncio + httpx in the bench process (a separate process from
the server): ``concurrency`` clients, each sending its next request the moment the previous one returns.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ragcache.processes import free_port, stop_process, wait_healthy

__all__ = ["ServiceProcess", "LoadResult", "run_load", "served", "LEVELS"]

LEVELS = ("L1", "L2", "L3", "Compute")


def served(response) -> dict[str, int]:
    """How many inputs of an /embed response each level served (its ``X-Cache-*`` headers)."""
    return {level: int(response.headers.get(f"x-cache-{level.lower()}", 0)) for level in LEVELS}


class ServiceProcess:
    def __init__(
        self,
        workdir: Path,
        *,
        redis_url: str,
        extra_env: dict[str, str] | None = None,
        timeout_s: float = 180.0,
        log_level: str = "warning",
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data_dir = workdir / f"service-{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "RAGCACHE_DATA_DIR": str(data_dir),
            "RAGCACHE_REDIS_URL": redis_url,
            **(extra_env or {}),
        }
        self.log_path = data_dir / "service.log"
        self._log = self.log_path.open("wb")
        # `ragcache serve`'s uvicorn settings, with the app that adds the bench's floor route (services/bench_floor.py).
        serve = (
            "import uvicorn; from ragcache.cli import SERVE_OPTIONS; "
            "uvicorn.run('services.bench_floor:create_bench_app', factory=True, host='127.0.0.1', "
            f"port={self.port}, workers=1, log_level={log_level!r}, **SERVE_OPTIONS)"
        )
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


@dataclass(frozen=True)
class LoadResult:
    num_requests: int
    num_texts: int
    seconds: float
    latencies_s: tuple[float, ...]
    response_bytes: int

    @property
    def texts_per_s(self) -> float:
        return self.num_texts / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.seconds


def run_load(url: str, path: str, bodies: list[bytes], texts_per_body: int, *, concurrency: int, seconds: float) -> LoadResult:
    """``concurrency`` clients cycle through ``bodies`` (pre-serialised JSON) for ``seconds``."""
    return asyncio.run(_load(url, path, bodies, texts_per_body, concurrency, seconds))


async def _load(url: str, path: str, bodies: list[bytes], texts_per_body: int, concurrency: int, seconds: float) -> LoadResult:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    received = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:
        # One untimed round opens every connection.
        await asyncio.gather(*(client.post(path, content=bodies[i % len(bodies)], headers=headers) for i in range(concurrency)))
        deadline = time.perf_counter() + seconds

        async def worker(offset: int) -> None:
            nonlocal received
            index = offset
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                response = await client.post(path, content=bodies[index % len(bodies)], headers=headers)
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise RuntimeError(f"POST {path} -> {response.status_code}: {response.text[:300]}")
                received += len(response.content)
                index += concurrency

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    return LoadResult(len(latencies), len(latencies) * texts_per_body, elapsed, tuple(latencies), received)
