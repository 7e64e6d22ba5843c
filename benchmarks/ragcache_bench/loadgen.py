"""The HTTP load generator of ``bench http``: asyncio + httpx in the bench process (a separate process from the
server), ``concurrency`` clients, each sending its next request the moment the previous one returns."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

__all__ = ["LoadResult", "run_load"]


@dataclass(frozen=True)
class LoadResult:
    num_requests: int
    num_texts: int
    seconds: float
    latencies_s: tuple[float, ...]
    response_bytes: int
    num_from_l1: int = 0  # texts the timed responses said L1 served (their X-Cache-L1 headers)

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
    received = from_l1 = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:
        # One untimed round opens every connection.
        await asyncio.gather(*(client.post(path, content=bodies[i % len(bodies)], headers=headers) for i in range(concurrency)))
        deadline = time.perf_counter() + seconds

        async def worker(offset: int) -> None:
            nonlocal received, from_l1
            index = offset
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                response = await client.post(path, content=bodies[index % len(bodies)], headers=headers)
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise RuntimeError(f"POST {path} -> {response.status_code}: {response.text[:300]}")
                received += len(response.content)
                from_l1 += int(response.headers.get("x-cache-l1", 0))
                index += concurrency

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    return LoadResult(len(latencies), len(latencies) * texts_per_body, elapsed, tuple(latencies), received, from_l1)
