"""A real multi-node Ray cluster on loopback: a head and worker nodes, each its own ``ray start --block``
process, as ``ray start`` makes them on separate machines.

Each node runs in a process group of its own (``start_new_session``), and stopping it ends the node and
every process under it by their ids (Ray's own actors start sessions of their own): never ``ray stop``,
which ends every Ray process of the machine, other people's included. Token authentication (on by default
since Ray 2.60) is off: the cluster listens on 127.0.0.1 only and lives as long as one test session or
benchmark.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis

from ragcache.storage.processes import free_port

__all__ = ["KillOnce", "RayCluster"]

# What a node's processes need in their environment: no token auth on loopback, the model offline, and no
# usage reporting (the machine has no internet).
NODE_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class RayCluster:
    """``num_nodes`` nodes (the head first) of ``num_cpus`` CPUs each; ``address`` is what ``ray.init`` takes.

    ``num_cpus`` is Ray's logical count, not the machine's: give a node more than the actors it runs, or Ray
    Data's read tasks wait for a CPU that the actors hold (the pipeline then never starts). Each node's own
    log goes to ``log_dir`` (default: the cluster's temporary folder, removed by ``stop``)."""

    def __init__(self, *, num_nodes: int = 2, num_cpus: int = 1, object_store_bytes: int = 100 * 1024**2,
                 log_dir: Path | None = None, startup_timeout_s: float = 90.0):
        self.num_nodes = num_nodes
        self.num_cpus = num_cpus
        self.object_store_bytes = object_store_bytes
        self.port = free_port()
        # Ray's sockets live under its temp folder; a unix socket path must stay under 108 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rc-ray-", dir="/tmp"))
        self.log_dir = log_dir or self.temp_dir
        self.startup_timeout_s = startup_timeout_s
        self.nodes: list[subprocess.Popen] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RayCluster:
        """Start the head, then the workers; returns once every node has joined."""
        try:
            self.nodes.append(self._start_node(["--head", "--port", str(self.port), "--node-ip-address", "127.0.0.1",
                                                "--include-dashboard", "false", "--temp-dir", str(self.temp_dir)], 0))
            for number in range(1, self.num_nodes):
                self.nodes.append(self._start_node(["--address", self.address, "--node-ip-address", "127.0.0.1"], number))
            self._wait_for_nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, arguments: list[str], number: int) -> subprocess.Popen:
        ray = Path(sys.executable).with_name("ray")
        command = [str(ray), "start", "--block", "--num-cpus", str(self.num_cpus), "--num-gpus", "0",
                   "--object-store-memory", str(self.object_store_bytes), "--disable-usage-stats", *arguments]
        with open(self.log_dir / f"node-{number}.log", "ab") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **NODE_ENV),
                                    start_new_session=True)

    def _wait_for_nodes(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        command = [str(Path(sys.executable).with_name("ray")), "status", "--address", self.address]
        while time.monotonic() < deadline:
            for number, node in enumerate(self.nodes):
                if node.poll() is not None:
                    raise RuntimeError(f"ray node {number} exited with {node.returncode}:\n{self.log_tail(number)}")
            status = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, **NODE_ENV), check=False)
            if status.returncode == 0 and status.stdout.count("node_") >= self.num_nodes:
                return
            time.sleep(1.0)
        raise RuntimeError(f"the Ray cluster did not have {self.num_nodes} nodes in {self.startup_timeout_s:.0f} s:\n{self.log_tail(0)}")

    def log_tail(self, number: int, num_chars: int = 3000) -> str:
        path = self.log_dir / f"node-{number}.log"
        return path.read_text(errors="replace")[-num_chars:] if path.exists() else "(no log)"

    def stop(self) -> None:
        """The workers first, then the head: each node's whole process group, SIGKILL after a grace period."""
        for node in reversed(self.nodes):
            _stop_group(node)
        self.nodes = []
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # Ray's session: sockets, spilled objects, its own logs

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _stop_group(node: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGTERM to the node and every process under it, SIGKILL to what is left after ``timeout_s``. The
    descendants are listed first: Ray's own actors start sessions of their own, outside the node's group."""
    try:
        processes = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        processes = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGKILL)  # what lingers of the group
    node.wait(timeout=10)


class KillOnce:
    """A fault for ``DocumentWriter(after_batch=...)``: the first call anywhere in the cluster SIGKILLs its own
    actor process, after its batch was written and before the batch's result is returned (the claim is a
    ``SET NX`` in Redis, so exactly one actor dies however many call it). The key holds the killed pid."""

    def __init__(self, redis_url: str, key: str):
        self.redis_url = redis_url
        self.key = key

    def __call__(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        try:
            first = client.set(self.key, os.getpid(), nx=True)
        finally:
            client.close()
        if first:
            os.kill(os.getpid(), signal.SIGKILL)
