"""A real `ragcache serve --workers 2` on the embedded defaults (embedded Redis, the shared Milvus Lite, the disk
level, the packaged model), and what it must survive (issues 38 and 40):

- a second `ragcache serve` on the same data folder, or on the same port: one line, a non-zero exit, nothing started
  and nothing left behind, the first service's files and lock untouched and still serving (40.5);
- its redis-server or its Milvus Lite server killed: started again on the same files, L2 and `/documents` writes
  working again without a restart of the service, each restart counted in `/stats` and `/metrics` (38.17);
- the shared Milvus Lite reachable by no other local user: a unix socket in a 0700 folder, no TCP port (38.7);
- the data folder 0700 and the files in it 0600 (38.9).

Only processes these tests started are killed: the servers of the first service, found by its data folder.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from ragcache.storage.data_folder import LOCK_FILE
from ragcache.storage.processes import free_port, poll_until, stop_process, wait_healthy
from tests.processes import processes_using, unix_sockets_of

SERVE = "from ragcache_cli.cli import main; raise SystemExit(main())"


def serve_command(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-c", SERVE, "serve", "--port", str(port), "--log-level", "warning", *extra]


def environment(data_dir: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("RAGCACHE_")}
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAGCACHE_DATA_DIR": str(data_dir)}


class Service:
    """The first service: `ragcache serve --workers 2` as a user starts it, in a data folder of its own."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / "first-service.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(serve_command(self.port, "--workers", "2"), env=environment(data_dir),
                                            stdout=log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=120)
        try:
            wait_healthy(self.process, f"{self.url}/health", name="the first service", timeout_s=600, interval_s=0.5,
                         log_tail=lambda: self.log_path.read_text(errors="replace")[-3000:])
        except RuntimeError:
            self.stop()
            raise

    def server(self, name: str) -> int:
        """The pid of the first service's server called ``name`` (redis-server, milvus): found by its data folder."""
        pids = [pid for pid in processes_using(self.data_dir) if _name_of(pid) == name]
        assert len(pids) == 1, (name, processes_using(self.data_dir))
        return pids[0]

    def restarts(self) -> dict[str, int]:
        return self.client.get("/stats").json()["embedded_restarts"]

    def stop(self) -> None:
        self.client.close()
        stop_process(self.process, timeout_s=60)


def _name_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    first = Service(tmp_path_factory.mktemp("one-service") / "data")
    yield first
    first.stop()
    assert processes_using(first.data_dir) == {}  # its Redis and Milvus Lite ended with it


def second_serve(port: int, data_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(serve_command(port), env=environment(data_dir), capture_output=True, text=True, timeout=300)


def snapshot(service: Service) -> tuple[dict[int, str], str, bool]:
    return (processes_using(service.data_dir), (service.data_dir / LOCK_FILE).read_text(),
            (service.data_dir / ".milvus.db.lock").exists())


def assert_still_serving(service: Service, text: str) -> None:
    answer = service.client.post("/embed", json={"inputs": [text]})
    assert answer.status_code == 200, answer.text


def test_a_second_serve_on_the_same_folder_says_so_in_one_line_and_starts_nothing(service):
    before = snapshot(service)
    second = second_serve(free_port(), service.data_dir)
    assert second.returncode != 0
    assert second.stderr.strip().splitlines() == [
        f"error: a ragcache (pid {service.process.pid}) already serves {service.data_dir}: stop it, or use another "
        "folder (RAGCACHE_DATA_DIR)"], second.stderr
    assert snapshot(service) == before  # no new redis-server or milvus, the same lock holder, Milvus' lock in place
    assert_still_serving(service, "still served after a second start on its folder")


def test_a_second_serve_on_the_same_port_says_so_in_one_line_and_starts_nothing(service, tmp_path):
    before = snapshot(service)
    other_folder = tmp_path / "data"
    second = second_serve(service.port, other_folder)
    assert second.returncode != 0
    assert second.stderr.strip().splitlines() == [
        f"error: port {service.port} is in use (on 127.0.0.1): stop what serves it, or pass --port"], second.stderr
    assert processes_using(other_folder) == {} and not (other_folder / "redis").exists()
    assert snapshot(service) == before
    assert_still_serving(service, "still served after a second start on its port")


def test_the_data_folder_is_private(service):
    def mode(path: Path) -> int:
        return stat.S_IMODE(os.lstat(path).st_mode)

    paths = [service.data_dir, *service.data_dir.rglob("*")]
    folders = {str(path): mode(path) for path in paths if path.is_dir()}
    files = {str(path): mode(path) for path in paths if path.is_file()}
    assert {"appendonly.aof", "milvus.db", "data.mdb"} <= {Path(path).name for path in files}
    assert folders == dict.fromkeys(folders, 0o700)
    assert files == dict.fromkeys(files, 0o600)


def test_the_shared_milvus_lite_listens_on_a_private_unix_socket_only(service):
    milvus = service.server("milvus")
    address = Path(f"/proc/{milvus}/cmdline").read_bytes().split(b"\0")[2].decode()
    assert address.startswith("unix:"), address  # not a TCP port any local user could reach
    socket_dir = Path(address.removeprefix("unix:")).parent
    assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700 and os.stat(socket_dir).st_uid == os.geteuid()


def test_a_killed_redis_comes_back_with_l2_and_document_writes(service):
    assert service.restarts() == {"redis": 0, "milvus": 0}
    redis_pid = service.server("redis-server")
    socket_path = next(path for path in unix_sockets_of(redis_pid) if path.endswith("/redis.sock"))
    os.kill(redis_pid, signal.SIGKILL)
    assert poll_until(lambda: service.restarts().get("redis") == 1, timeout_s=120, interval_s=0.25)
    assert service.server("redis-server") != redis_pid

    # L2 writes: new texts reach the restarted Redis (on the same socket, the same append-only file).
    client = redis.Redis(unix_socket_path=socket_path)
    try:
        num_keys = client.dbsize()
        assert_still_serving(service, "a text first embedded after the restart of redis")
        assert poll_until(lambda: client.dbsize() > num_keys, timeout_s=60, interval_s=0.2)
    finally:
        client.close()
    add = service.client.post("/documents", json={"collection": "after-restart",
                                                  "documents": [{"id": "1", "text": "written after redis restarted"}]})
    assert add.status_code == 200, add.text
    metrics = service.client.get("/metrics").text
    assert 'ragcache_embedded_server_restarts_total{server="redis"} 1.0' in metrics


def test_a_killed_milvus_lite_comes_back_with_document_writes(service):
    milvus_pid = service.server("milvus")
    os.kill(milvus_pid, signal.SIGKILL)
    assert poll_until(lambda: service.restarts().get("milvus") == 1, timeout_s=120, interval_s=0.25)
    deadline = time.monotonic() + 120
    while True:  # the workers' gRPC channels reconnect on their own schedule
        add = service.client.post("/documents", json={"collection": "after-milvus-restart",
                                                      "documents": [{"id": "1", "text": "written after milvus restarted"}]})
        if add.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert add.status_code == 200, add.text
    found = service.client.post("/documents/get", json={"collection": "after-milvus-restart", "ids": ["1"]})
    assert found.status_code == 200 and "written after milvus restarted" in found.text
    assert 'ragcache_embedded_server_restarts_total{server="milvus"} 1.0' in service.client.get("/metrics").text

