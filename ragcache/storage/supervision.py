"""Embedded servers kept alive: a server that dies is started again on the same files, with back-off.

The embedded Redis (and under ``ragcache serve --workers N`` the shared Milvus Lite server) is a child process
the service depends on for L2, prefixes, the result cache's versions and ``/documents`` writes. Killed (the OOM
killer, a stray ``kill -9``), it used to stay dead until the whole service was restarted by hand. ``Supervisor``
watches one child from a thread; when it exits without ``stop`` having been asked, it is started again by the
server's own ``launch`` (same files, same socket, so every client reconnects to the same address), after a delay
that doubles from ``min_backoff_s`` to ``max_backoff_s`` while the server keeps dying soon after each start (a
crash loop must not spin), and falls back to the minimum once it has stayed up ``stable_s``. Each restart is
counted (``num_restarts``): ``/stats`` and ``/metrics`` show it.

Under ``ragcache serve --workers N`` the servers run in the parent process and the counts are needed in the
workers, which answer ``/stats``: the parent writes them to ``RESTARTS_FILE`` in the data folder with its pid, and a
worker believes the file only when that pid is its parent's (``shared_restarts``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["RESTARTS_FILE", "Supervisor", "shared_restarts", "write_shared_restarts"]

log = logging.getLogger(__name__)

RESTARTS_FILE = "server-restarts.json"
# A server stopped by SIGTERM or SIGINT was most likely sent it with the whole process group (Ctrl-C, a service
# manager stopping the service): the service's own stop follows within moments, and restarting the server in between
# would start a server only to stop it. Such an exit is restarted after this grace instead of the back-off.
STOPPED_BY_SIGNAL_GRACE_S = 5.0


class Supervisor:
    """Restarts the child that ``process()`` returns whenever it has exited, by calling ``launch()`` (which starts it
    and waits until it answers, raising if it cannot); ``on_restart(num_restarts)`` after each restart. ``stop_and``
    stops the watching and runs the server's own stop under the same lock, so a restart never races a stop.
    ``clock`` and ``sleep`` (the back-off's wait, True when stopped meanwhile) are the tests' seams."""

    def __init__(self, name: str, process: Callable[[], subprocess.Popen | None], launch: Callable[[], None], *,
                 on_restart: Callable[[int], None] | None = None, min_backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, stable_s: float = 60.0, poll_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], bool] | None = None):
        self.name = name
        self.num_restarts = 0
        self._process, self._launch, self._on_restart = process, launch, on_restart
        self._min_backoff_s, self._max_backoff_s, self._stable_s, self._poll_s = min_backoff_s, max_backoff_s, stable_s, poll_s
        self._clock = clock
        self._stopping = threading.Event()
        # The back-off's wait: True when stop was asked meanwhile (a test passes one that records the delays).
        self._sleep = sleep if sleep is not None else self._stopping.wait
        self._lock = threading.Lock()  # held while (re)starting or stopping the server
        self._thread = threading.Thread(target=self._watch, name=f"supervise-{name}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        backoff_s = self._min_backoff_s
        started_at = self._clock()
        while not self._stopping.wait(self._poll_s):
            process = self._process()
            if process is None or process.poll() is None:
                continue
            if self._clock() - started_at >= self._stable_s:
                backoff_s = self._min_backoff_s  # it had been up a while: not a crash loop
            wait_s = backoff_s
            if process.returncode in (-signal.SIGTERM, -signal.SIGINT):
                wait_s = max(backoff_s, STOPPED_BY_SIGNAL_GRACE_S)
                log.info("the embedded %s was stopped by a signal; starting it again in %.1f s unless the service "
                         "stops meanwhile", self.name, wait_s)
            else:
                log.warning("the embedded %s exited with %s; starting it again in %.1f s on the same files",
                            self.name, process.returncode, wait_s)
            if self._sleep(wait_s):
                return
            backoff_s = min(backoff_s * 2, self._max_backoff_s)
            started_at = self._clock()
            if self._restart():
                log.warning("the embedded %s is back (restart %d)", self.name, self.num_restarts)

    def _restart(self) -> bool:
        with self._lock:
            if self._stopping.is_set():
                return False
            try:
                self._launch()
            except Exception as exc:  # noqa: BLE001 - any failure to start is retried after the next back-off
                log.error("the embedded %s did not start again: %s", self.name, exc)
                return False
            self.num_restarts += 1
            if self._on_restart is not None:
                self._on_restart(self.num_restarts)
            return True

    def stop_and(self, stop: Callable[[], None]) -> None:
        """Stop watching, then ``stop()`` the server (no restart can start after this returns)."""
        self._stopping.set()
        with self._lock:
            stop()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)


def write_shared_restarts(data_dir: Path, restarts: Mapping[str, int]) -> None:
    """Publish the parent's restart counts to its workers (replaced whole: a reader never sees half a file)."""
    Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    path = Path(data_dir) / RESTARTS_FILE
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({"pid": os.getpid(), **restarts}, file)
    os.replace(temporary, path)


def shared_restarts(data_dir: Path) -> dict[str, int]:
    """The restart counts this process's parent published (``write_shared_restarts``), or none: a file left by
    another process, an earlier run, is not this service's."""
    try:
        published = json.loads((Path(data_dir) / RESTARTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(published, dict) or published.pop("pid", None) != os.getppid():
        return {}
    return {name: count for name, count in published.items() if isinstance(count, int)}
