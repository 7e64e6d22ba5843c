"""The child processes the library starts: ``poll_until`` (the one wait-until-ready loop: embedded Redis, Redis
Cluster, Milvus Lite, the service, vLLM, Infinity all wait through it), the supervision that starts a dead embedded
server again, and Milvus Lite servers that end with their connections or their owner."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from ragcache.errors import ConfigError
from ragcache.storage.embedded_milvus import MilvusLiteServer
from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache.storage.processes import ProcessExited, poll_until
from ragcache.storage.stores import open_milvus
from ragcache.storage.supervision import STOPPED_BY_SIGNAL_GRACE_S, Supervisor
from tests.processes import children_named


def test_ready_after_a_few_refusals():
    answers = iter([ConnectionRefusedError(), ConnectionRefusedError(), False, True])

    def ready():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert poll_until(ready, timeout_s=30, interval_s=0.001, not_yet=(OSError,)) is True


def test_an_unexpected_error_is_not_swallowed():
    def ready():
        raise ValueError("a bug, not a server still starting")

    with pytest.raises(ValueError):
        poll_until(ready, timeout_s=30, not_yet=(OSError,))


def test_never_ready_is_false_after_the_timeout():
    assert poll_until(lambda: False, timeout_s=0.05, interval_s=0.01) is False


def test_a_process_that_exits_ends_the_wait_at_once():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait(timeout=30)
    with pytest.raises(ProcessExited, match="exited with 3") as caught:
        poll_until(lambda: False, timeout_s=3600, process=process, name="the child")
    assert caught.value.returncode == 3


# --- Supervision (ragcache.storage.supervision): an embedded server that dies is started again on its files. ---


class _Child:
    """A child process as the supervisor sees it: alive until ``die()``."""

    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode

    def die(self, returncode: int = -9):
        self.returncode = returncode


def test_the_back_off_doubles_while_starts_fail_and_resets_once_the_server_stayed_up():
    now = [0.0]
    delays: list[float] = []
    children = [_Child()]
    outcomes = iter([RuntimeError("port taken"), RuntimeError("still"), None, None])

    def launch():
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome
        children.append(_Child())

    def sleep(seconds):
        delays.append(seconds)
        return False

    restarts: list[int] = []
    supervisor = Supervisor("fake", lambda: children[-1], launch, on_restart=restarts.append, min_backoff_s=0.5,
                            max_backoff_s=1.5, stable_s=60.0, poll_s=0.001, clock=lambda: now[0], sleep=sleep)
    try:
        children[-1].die()
        assert poll_until(lambda: len(children) == 2, timeout_s=60, interval_s=0.001)
        assert delays == [0.5, 1.0, 1.5] and restarts == [1]  # doubled, capped at max_backoff_s
        now[0] += 61.0  # up longer than stable_s: its next death is not a crash loop
        children[-1].die()
        assert poll_until(lambda: len(children) == 3, timeout_s=60, interval_s=0.001)
        assert delays == [0.5, 1.0, 1.5, 0.5] and restarts == [1, 2] and supervisor.num_restarts == 2
    finally:
        stopped = []
        supervisor.stop_and(lambda: stopped.append(True))
    assert stopped == [True]


def test_a_server_stopped_by_the_groups_signal_waits_for_the_services_own_stop():
    # Ctrl-C or a service manager signals the whole process group: the server's SIGTERM exit is not restarted at once
    # (the service stops it in a moment), and when the stop comes during the grace nothing is started.
    delays: list[float] = []
    children = [_Child()]
    stopping = threading.Event()

    def sleep(seconds):
        delays.append(seconds)
        stopping.wait()
        return True  # stop was asked meanwhile

    supervisor = Supervisor("fake", lambda: children[-1], lambda: children.append(_Child()), min_backoff_s=0.5,
                            poll_s=0.001, sleep=sleep)
    children[-1].die(-signal.SIGTERM)
    assert poll_until(lambda: delays == [STOPPED_BY_SIGNAL_GRACE_S], timeout_s=60, interval_s=0.001)
    stopping.set()
    supervisor.stop_and(lambda: None)
    assert len(children) == 1 and supervisor.num_restarts == 0


def test_a_killed_supervised_redis_comes_back_on_its_files(tmp_path):
    restarts: list[int] = []
    server = EmbeddedRedis(tmp_path / "redis", unix_socket=True, supervise=True, on_restart=restarts.append)
    try:
        client = redis.Redis.from_url(server.url)
        client.set("acknowledged", "before the kill")
        killed = server.process.pid
        os.kill(killed, signal.SIGKILL)
        assert poll_until(lambda: server.num_restarts == 1, timeout_s=120)
        assert server.process.pid != killed and restarts == [1]
        assert client.get("acknowledged") == b"before the kill"  # the same append-only file, the same socket
        client.close()
    finally:
        server.stop()
    assert server.process.poll() is not None  # a stop is not a death: nothing started it again
    time.sleep(0.5)
    assert server.num_restarts == 1


def test_an_unsupervised_redis_stays_dead(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis", unix_socket=True)
    try:
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=30)
        time.sleep(1.0)
        assert server.process.poll() is not None and server.num_restarts == 0
    finally:
        server.stop()


# --- Milvus Lite: every server a connection starts is released when it closes (issue 38.15). ---


def test_closing_milvus_lite_connections_stops_their_servers(tmp_path):
    before = children_named("milvus")
    connections = [open_milvus(str(tmp_path / f"l3-{index}.db")) for index in range(3)]
    again = open_milvus(str(tmp_path / "l3-0.db"))  # a second connection to one path shares its server
    for connection in [*connections, again]:
        connection.list_collections()
    assert len(children_named("milvus") - before) == 3
    connections[0].close()
    assert len(children_named("milvus") - before) == 3  # l3-0.db still has a connection open
    for connection in [*connections[1:], again]:
        connection.close()
    assert children_named("milvus") - before == set()


def test_the_shared_milvus_lite_is_on_a_private_socket_and_never_outlives_its_owner(tmp_path):
    server = MilvusLiteServer(tmp_path / "l3.db", unix_socket=True)
    try:
        assert server.url.startswith("unix:") and server.socket_path is not None
        assert stat.S_IMODE(os.stat(server.socket_path.parent).st_mode) == 0o700
        assert server.process is not None and f"unix:{server.socket_path}" in server.process.args  # no TCP port at all
        assert open_milvus(server.url).list_collections() == []
        if os.geteuid() == 0:  # as another local user: refused
            assert _connect_as(65534, str(server.socket_path)) == "refused"
    finally:
        server.close()
    assert not server.socket_path.parent.exists()


def _connect_as(uid: int, socket_path: str) -> str:
    code = ("import os, socket, sys\nos.setgid(65534)\nos.setuid(int(sys.argv[1]))\n"
            "s = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[2])\nexcept OSError:\n    print('refused')\n"
            "else:\n    print('connected')\n")
    return subprocess.run([sys.executable, "-c", code, str(uid), socket_path], capture_output=True, text=True,
                           timeout=60).stdout.strip()


def test_a_milvus_lite_server_exits_with_the_process_that_started_it(tmp_path):
    # The owner is killed (kill -9: no clean-up of its own): the kernel frees its lock, and milvus exits with it.
    code = ("import sys, time\nfrom ragcache.storage.embedded_milvus import MilvusLiteServer\n"
            "server = MilvusLiteServer(sys.argv[1], unix_socket=True)\nprint(server.process.pid, flush=True)\ntime.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "l3.db")], stdout=subprocess.PIPE, text=True)
    milvus_pid = int(owner.stdout.readline())  # type: ignore[union-attr]
    owner.kill()
    owner.wait(timeout=30)
    assert poll_until(lambda: not Path(f"/proc/{milvus_pid}").exists() or "Z" in _state(milvus_pid), timeout_s=60)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_second_embedded_redis_on_one_folder_in_one_process_is_refused(tmp_path):
    # Before: the second stopped the first's server as an "orphan"; supervised, the two would stop each other in turn.
    first = EmbeddedRedis(tmp_path / "redis", unix_socket=True, supervise=True)
    try:
        with pytest.raises(ConfigError, match="already runs in this process"):
            EmbeddedRedis(tmp_path / "redis", unix_socket=True, supervise=True)
        assert first.process.poll() is None and first.num_restarts == 0
    finally:
        first.stop()
