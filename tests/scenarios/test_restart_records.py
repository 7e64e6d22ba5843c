"""Acknowledged records survive the service (audit round four, Medium 3): the embedded Redis of earlier versions
was given its save points as one argument, which redis-server 6.2 reads as none, and kept no append-only file, so
registered prefixes, model fingerprints and collection versions were gone after every restart. Here the real
``ragcache serve`` (embedded defaults, the instant upstream as its model) is stopped with SIGTERM, and killed with
SIGKILL together with its Redis, and what was registered before is there after the restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import psutil
import pytest
import redis

from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache_testing.instant import InstantUpstream
from tests.scenarios.test_disk_level_service import Serve

TARGET = "http://127.0.0.1:9"  # a listed vLLM endpoint that answers nothing: registering needs no warm to succeed
ENV = {"RAGCACHE_PREFIX_VLLM_ENDPOINTS": f'["{TARGET}"]'}


@pytest.fixture(scope="module")
def upstream():
    with InstantUpstream(dim=64) as running:
        yield running


def register(serve: Serve, name: str) -> None:
    with httpx.Client(base_url=serve.url, timeout=60) as client:
        answer = client.post("/prefixes", json={"name": name, "text": f"You are {name}.\n\n", "pinned": False,
                                                "target": {"base_url": TARGET, "model": "m"}})
    assert answer.status_code == 201, answer.text


def registered(serve: Serve) -> list[str]:
    with httpx.Client(base_url=serve.url, timeout=60) as client:
        answer = client.get("/prefixes")
    assert answer.status_code == 200, answer.text
    return sorted(prefix["name"] for prefix in answer.json())


def test_prefixes_survive_a_sigterm_restart(upstream, tmp_path):
    first = Serve(upstream, tmp_path, env=ENV)
    try:
        for name in ("support", "billing"):
            register(first, name)
    finally:
        first.stop()
    again = Serve(upstream, tmp_path, env=ENV)
    try:
        assert registered(again) == ["billing", "support"]
    finally:
        again.stop()


def test_prefixes_survive_a_kill_9_of_the_service_and_its_redis(upstream, tmp_path):
    first = Serve(upstream, tmp_path, env=ENV)
    try:
        register(first, "support")
    finally:
        os.killpg(first.process.pid, signal.SIGKILL)  # the service, its embedded Redis, everything it started
        first.process.wait(timeout=30)
        first.log.close()
    again = Serve(upstream, tmp_path, env=ENV)
    try:
        assert registered(again) == ["support"]
        children = subprocess.run(["pgrep", "-s", str(again.process.pid), "-a"], capture_output=True, text=True).stdout
        assert children.count("redis-server") == 1
    finally:
        again.stop()


def test_the_embedded_redis_saves_appends_and_listens_only_on_a_private_socket(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis", unix_socket=True)
    try:
        client = redis.Redis.from_url(server.url)
        assert client.config_get("save") == {"save": "300 1 60 10000"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("port") == {"port": "0"}  # no TCP listener at all
        assert server.socket_path is not None and (server.socket_path.parent.stat().st_mode & 0o777) == 0o700
        client.hset("rc:records", "fingerprint", "v1")  # a record without a TTL, acknowledged
        client.close()
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=10)
    finally:
        server.stop()
    reopened = EmbeddedRedis(tmp_path / "redis", unix_socket=True)
    try:
        client = redis.Redis.from_url(reopened.url)
        assert client.hget("rc:records", "fingerprint") == b"v1"
        client.close()
    finally:
        reopened.stop()


# A process that starts an embedded Redis on a folder, writes one key through it and waits to be killed.
ORPHANS_PARENT = """
import sys, time, redis
from ragcache.storage.embedded_redis import EmbeddedRedis
server = EmbeddedRedis(sys.argv[1], unix_socket=True)
client = redis.Redis.from_url(server.url)
client.set("written by the orphan", "kept")
client.close()
print(server.process.pid, flush=True)
time.sleep(600)
"""


def test_a_redis_orphaned_on_the_folder_is_stopped_before_a_new_one_starts(tmp_path):
    # The orphan's parent is another process, killed -9 as a crashed service would be: its redis-server lives on.
    # (A second Redis on the same folder from this very process is refused instead: test_processes.)
    parent = subprocess.Popen([sys.executable, "-c", ORPHANS_PARENT, str(tmp_path / "redis")], stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    orphan = psutil.Process(int(parent.stdout.readline()))
    parent.kill()
    parent.wait(timeout=30)
    assert orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE
    successor = EmbeddedRedis(tmp_path / "redis", unix_socket=True)
    try:
        # Stopped with SIGTERM before the successor started: it synced its file and exited, so what it took is kept.
        assert not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE
        client = redis.Redis.from_url(successor.url)
        assert client.get("written by the orphan") == b"kept"
        client.close()
    finally:
        successor.stop()
