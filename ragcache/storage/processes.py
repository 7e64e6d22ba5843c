"""Child processes the library or its benchmarks start (redis-server, Milvus Lite, the service, vLLM): a free
port for them, waiting until they answer (``poll_until``, the one wait-until-ready loop; ``wait_healthy`` for
an HTTP health route), and stopping them politely."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

__all__ = ["HttpServerProcess", "ProcessExited", "free_port", "poll_until", "stop_process", "wait_healthy"]


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


class HttpServerProcess:
    """An HTTP server run as a child process on loopback (Infinity, vLLM): started, waited on until its
    ``/health`` answers, and stopped. A subclass gives ``command()``, and may add environment variables, a
    working folder, or a process group of its own (a server with children of its own, stopped together)."""

    name = "the server"
    extra_env: dict[str, str] = {}
    own_process_group = False
    health_interval_s = 0.25
    stop_timeout_s = 15.0

    def __init__(self, *, port: int = 0, startup_timeout_s: float, log_path: Path | None = None, cwd: Path | None = None):
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        """Launch the server and wait until it is healthy; raises RuntimeError (with the log tail) if not."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **self.extra_env)
        started = time.monotonic()
        with open(self.log_path or os.devnull, "ab") as log:
            self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                                          start_new_session=self.own_process_group)
        try:
            wait_healthy(self._proc, f"{self.base_url}/health", name=self.name, timeout_s=self.startup_timeout_s,
                         interval_s=self.health_interval_s, log_tail=self._log_tail)
        except RuntimeError:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started

    def stop(self) -> None:
        """SIGTERM (to the whole process group when it has one), SIGKILL after ``stop_timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if not self.own_process_group:
            stop_process(proc, timeout_s=self.stop_timeout_s)
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def _log_tail(self, num_chars: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
