"""The disk level in the real service (``ragcache serve``, real processes, real LMDB in a temporary data folder),
in front of the instant upstream (``ragcache_testing.instant``) so that no model is loaded: a restart serves
from disk what was written before it, and ``--workers 2`` on the embedded defaults answers from one shared disk
level, one embedded Redis and one Milvus Lite server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ragcache.storage.processes import free_port, stop_process, wait_healthy
from ragcache_testing.instant import InstantUpstream


@pytest.fixture(scope="module")
def upstream():
    with InstantUpstream(dim=64) as running:
        yield running


class Serve:
    """``ragcache serve`` as a user runs it, in ``data_dir``, with ``workers`` processes."""

    def __init__(self, upstream: InstantUpstream, data_dir: Path, *, workers: int = 1, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "RAGCACHE_DATA_DIR": str(data_dir), "RAGCACHE_MODELS_JSON": upstream.models_json,
                    "RAGCACHE_MODEL": upstream.model, "RAGCACHE_DRIFT_CHECK": "false", **(env or {})}
        for name in ("RAGCACHE_REDIS_URL", "RAGCACHE_MILVUS_URI", "RAGCACHE_DISK_PATH"):
            if name not in (env or {}):
                full_env.pop(name, None)  # the embedded defaults, as `make serve` has them
        self.log = (data_dir / f"serve-{self.port}.log").open("wb")
        command = [sys.executable, "-m", "ragcache_cli.cli", "serve", "--port", str(self.port), "--workers", str(workers)]
        self.process = subprocess.Popen(command, env=full_env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_healthy(self.process, f"{self.url}/health", name="ragcache serve", timeout_s=180, interval_s=0.25,
                     log_tail=lambda: "")

    def embed(self, texts: list[str]) -> dict[str, int]:
        # A new connection each time: with several workers, any of them may answer.
        with httpx.Client(base_url=self.url, timeout=60) as client:
            response = client.post("/embed", json={"inputs": texts})
        assert response.status_code == 200, response.text
        return {name: int(response.headers.get(f"x-cache-{name}", 0)) for name in ("l1", "disk", "l2", "l3", "compute")}

    def stop(self) -> None:
        stop_process(self.process, timeout_s=60)
        self.log.close()


def test_a_restart_serves_from_disk_what_was_written_before_it(upstream, tmp_path):
    texts = [f"written before the restart {i}" for i in range(16)]
    # L2 and L3 off: only the disk level can carry the vectors across the restart.
    env = {"RAGCACHE_REDIS_URL": "off", "RAGCACHE_MILVUS_URI": "off"}
    first = Serve(upstream, tmp_path, env=env)
    try:
        assert first.embed(texts)["compute"] == 16
    finally:
        first.stop()  # a graceful stop flushes the write-behind into the disk level
    assert (tmp_path / "disk").is_dir()
    again = Serve(upstream, tmp_path, env=env)
    try:
        assert again.embed(texts) == {"l1": 0, "disk": 16, "l2": 0, "l3": 0, "compute": 0}
        with httpx.Client(base_url=again.url) as client:
            levels = client.get("/stats").json()["models"][upstream.model]["since_start"]["levels"]
            settings = client.get("/info").json()["settings"]
        assert [level["level"] for level in levels] == ["L1", "disk"]
        # No L3 (milvus off): no admission rule to report, though a disk level would make it "reuse".
        assert settings["disk"] == str(tmp_path / "disk") and settings["l3_admission"] == "off"
    finally:
        again.stop()


def test_two_workers_on_the_embedded_defaults_share_one_disk_level(upstream, tmp_path):
    texts = [f"shared by the workers {i}" for i in range(8)]
    serve = Serve(upstream, tmp_path, workers=2)
    try:
        assert serve.embed(texts)["compute"] == 8
        # Until the other worker answers: it has the texts in no L1 of its own, so the host's disk level serves them.
        # Nothing is computed again, whichever worker answers.
        seen = []
        for _ in range(200):
            served = serve.embed(texts)
            assert served["compute"] == 0, served
            seen.append(served)
            if served["disk"] == 8:
                break
        assert seen[-1]["disk"] == 8, seen[-5:]
        children = subprocess.run(["pgrep", "-s", str(serve.process.pid), "-a"], capture_output=True, text=True).stdout
        assert children.count("redis-server") == 1  # one embedded Redis for both workers
        assert sum("lib/milvus" in line for line in children.splitlines()) == 1  # one Milvus Lite: one L3 writer
        with httpx.Client(base_url=serve.url) as client:
            settings = client.get("/info").json()["settings"]
        # The embedded default: L3 on (the workers' one Milvus Lite server), behind a disk level, so it takes only
        # what proved reuse.
        # On a unix socket in a private folder: Milvus Lite has no authentication (docs/SECURITY.md).
        assert settings["l3_admission"] == "reuse" and settings["milvus"].startswith("unix:/")
    finally:
        serve.stop()
