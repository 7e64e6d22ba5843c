"""Child processes the library or its benchmarks start (redis-server, Milvus Lite, the service, vLLM): a free
port for them, waiting until they answer (``poll_until``, the one wait-until-ready loop; ``wait_healthy`` for
an HTTP health route), and stopping them politely."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import httpx

__all__ = ["ProcessExited", "free_port", "poll_until", "stop_process", "wait_healthy"]


class ProcessExited(RuntimeError):
    """The process being waited on exited before it was ready; ``returncode`` says how."""

    def __init__(self, name: str, returncode: int | None):
        super().__init__(f"{name} exited with {returncode}")
        self.returncode = returncode


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def poll_until(
    ready: Callable[[], bool],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    process: subprocess.Popen | None = None,
    name: str = "the process",
    not_yet: tuple[type[BaseException], ...] = (),
) -> bool:
    """Ask ``ready()`` every ``interval_s`` until it says True (then True) or ``timeout_s`` has passed (then
    False). An exception of a ``not_yet`` type counts as "not ready yet" (a server still starting refuses
    connections); with ``process``, ``ProcessExited`` as soon as it has exited, rather than at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise ProcessExited(name, process.returncode)
        try:
            if ready():
                return True
        except not_yet:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def wait_healthy(process: subprocess.Popen, health_url: str, *, name: str, timeout_s: float, interval_s: float,
                 log_tail: Callable[[], str]) -> None:
    """Return once ``health_url`` answers 200; raise RuntimeError (with ``log_tail()``) if ``process`` exits
    first or ``timeout_s`` passes. The caller decides what to stop."""
    with httpx.Client(timeout=2.0) as http:
        try:
            healthy = poll_until(lambda: http.get(health_url).status_code == 200, timeout_s=timeout_s,
                                 interval_s=interval_s, process=process, name=name, not_yet=(httpx.HTTPError,))
        except ProcessExited as exc:
            raise RuntimeError(f"{exc}:\n{log_tail()}") from exc
    if not healthy:
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
