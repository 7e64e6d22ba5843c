"""Several service processes (replicas) on one Redis and one Milvus server, started side by side."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ragcache_testing.service import ServiceProcess

__all__ = ["start_replicas", "stop_replicas"]


def start_replicas(workdir: Path, count: int, *, redis_url: str, milvus_url: str,
                   extra_env: dict[str, str] | None = None) -> list[ServiceProcess]:
    """``count`` service processes (``ragcache serve``) on one Redis and one Milvus server, started side by side."""
    env = {"RAGCACHE_MILVUS_URI": milvus_url, **(extra_env or {})}
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(ServiceProcess, workdir, redis_url=redis_url, extra_env=env) for _ in range(count)]
    started = [future.result() for future in futures if future.exception() is None]
    failed = [future.exception() for future in futures if future.exception() is not None]
    if failed:
        stop_replicas(started)
        raise failed[0]  # type: ignore[misc]
    return started


def stop_replicas(replicas: list[ServiceProcess]) -> None:
    for replica in replicas:
        replica.stop()
