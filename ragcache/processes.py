"""Child processes the library or its benchmarks start (redis-server, the service, vLLM): a free port for
them, waiting until they answer, and stopping them politely."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import httpx

__all__ = ["free_port", "stop_process", "wait_healthy"]


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(process: subprocess.Popen, health_url: str, *, name: str, timeout_s: float, interval_s: float,
                 log_tail: Callable[[], str]) -> None:
    """Return once ``health_url`` answers 200; raise RuntimeError (with ``log_tail()``) if ``process`` exits
    first or ``timeout_s`` passes. The caller decides what to stop."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_tail()}")
            try:
                if http.get(health_url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(interval_s)
    raise RuntimeError(f"{name} did not become healthy in {timeout_s:.0f} s:\n{log_tail()}")


def stop_process(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout_s`` for a clean exit (redis-server saves, the service flushes), then SIGKILL."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
