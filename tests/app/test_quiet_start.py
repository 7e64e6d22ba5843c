"""`ragcache serve` as a person runs it: a start-up that cannot work is one line (the traceback under --log-level
debug), and a start, some work and a stop print none of the dependency warnings that look like errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from ragcache.storage.processes import free_port

# Lines that start-up and shutdown printed (issue 40.9), none of them a fault.
NOISE = ("pkg_resources is deprecated", "too_many_pings", "GOAWAY", "failed to get mvccTs", "TracerWarning",
         "leaked semaphore", "Loading weights", "Traceback")


def serve(tmp_path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    environment = {**os.environ, "RAGCACHE_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1",
                   "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    environment.pop("RAGCACHE_REDIS_URL", None)
    command = [sys.executable, "-m", "ragcache_cli", "serve", "--port", str(port), *args]
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), port


@pytest.mark.parametrize("log_level", ["info", "debug"])
def test_a_start_up_configuration_error_is_one_line_and_its_traceback_is_under_debug(tmp_path, log_level):
    process, _ = serve(tmp_path, "--log-level", log_level, env={"RAGCACHE_RERANK_MODELS": json.dumps([str(tmp_path / "no-reranker")])})
    _, err = process.communicate(timeout=600)
    assert process.returncode != 0
    if log_level == "debug":
        assert "Traceback" in err and "no-reranker" in err
        return
    errors = [line for line in err.splitlines() if "ERROR" in line or "error" in line.lower()]
    assert len(errors) == 1, err
    assert "ragcache cannot start: cannot load cross-encoder" in errors[0] and "no-reranker" in errors[0]
    assert "Traceback" not in err and "startup failed" not in err


@pytest.mark.slow
def test_a_start_work_and_stop_with_workers_print_no_dependency_noise(tmp_path):
    process, port = serve(tmp_path, "--workers", "2")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        assert process.poll() is None, process.communicate()[1]
        documents = [{"id": "a", "text": "alpha"}, {"id": "b", "text": "beta"}]
        assert httpx.post(url + "/documents", json={"collection": "quiet", "documents": documents}, timeout=120).status_code == 200
        # Listing ids runs pymilvus' query_iterator, which warned at every call on Milvus Lite.
        listed = httpx.post(url + "/documents/ids", json={"collection": "quiet"}, timeout=120)
        assert listed.status_code == 200 and sorted(listed.json()["ids"]) == ["a", "b"]
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=300)
    shown = [line for line in err.splitlines() if any(noise in line for noise in NOISE)]
    assert shown == [], err
