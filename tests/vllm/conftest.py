"""Fixtures for the tests against a real vLLM server (run by `make test-vllm`).

The server comes from the vLLM virtual environment and the tiny model that `mk/vllm.mk` builds; their
paths arrive in RAGCACHE_VLLM_PYTHON and RAGCACHE_TINY_LLAMA. Without them the tests skip, except
under CI (CI=true), where a skipped vLLM test is turned into a failure: CI must prove this path works.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from ragcache.prefixes import EventsConfig, Target
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

# 128 blocks of 32 tokens = a 4096-token KV cache: a few 1k-token prompts evict everything.
# The tests assume this block size (BLOCK_SIZE in test_prefix_registry_vllm.py).
NUM_BLOCKS = 128
BLOCK_SIZE = 32


def wait_for(predicate, timeout_s: float, what: str) -> float:
    """Seconds until ``predicate`` held: a correctness wait with a generous deadline, never asserted on."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def started_with_events(registry, vllm_server):
    """``registry`` started, once its KV-events subscriber to ``vllm_server`` has synced (a fixture yields it)."""
    registry.start()
    subscriber = registry._keep_warm.engines.subscriber(vllm_server.base_url)
    assert subscriber is not None
    wait_for(lambda: subscriber.synced, 30, "the subscriber to sync with vLLM's publisher")
    return registry


def private_folder(tmp_path_factory, name: str) -> Path:
    """A folder only this user may enter, for the ipc:// event sockets (a short path: a socket's is at most 107 bytes)."""
    folder = tmp_path_factory.mktemp(name)
    folder.chmod(0o700)
    return folder


def events_of(*servers) -> dict[str, EventsConfig]:
    """The registry's KV-events config for ``servers`` (each started with kv_events_dir)."""
    return {s.base_url: EventsConfig(s.config.kv_events_endpoint, s.config.kv_replay_endpoint) for s in servers}


@pytest.fixture(scope="session")
def vllm_paths() -> tuple[Path, Path]:
    python = os.environ.get("RAGCACHE_VLLM_PYTHON")
    model = os.environ.get("RAGCACHE_TINY_LLAMA")
    if not python or not model or not Path(python).exists() or not Path(model, "config.json").exists():
        pytest.skip("no vLLM environment: run `make test-vllm` (sets RAGCACHE_VLLM_PYTHON, RAGCACHE_TINY_LLAMA)")
    return Path(python), Path(model)


@pytest.fixture(scope="session")
def vllm_server(vllm_paths, tmp_path_factory):
    """One real vLLM server for the session, with prefix caching on and a small KV cache."""
    python, model = vllm_paths
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    # KV events on (issue 30): the event tests subscribe to them; the others do not notice. On ipc:// sockets in a
    # folder of this user's own (pytest makes it 0700): an address nobody else can bind (docs/kv-events.md).
    server = VLLMServer(VLLMServerConfig(python=python, model=model, block_size=BLOCK_SIZE,
                                         num_blocks=NUM_BLOCKS, log_path=log_path,
                                         kv_events_dir=private_folder(tmp_path_factory, "vllm-events")))
    server.start()
    print(f"vLLM started in {server.startup_s:.1f}s on {server.base_url} (log: {log_path})")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def second_vllm_server(vllm_paths, tmp_path_factory):
    """A second replica of the same model (a fleet of two): started once, for the fleet tests' module only
    (they are all in one module), so the later tests do not share the two cores with it."""
    python, model = vllm_paths
    log_path = tmp_path_factory.mktemp("vllm-b") / "server.log"
    server = VLLMServer(VLLMServerConfig(python=python, model=model, block_size=BLOCK_SIZE,
                                         num_blocks=NUM_BLOCKS, log_path=log_path,
                                         kv_events_dir=private_folder(tmp_path_factory, "vllm-b-events")))
    server.start()
    print(f"second vLLM started in {server.startup_s:.1f}s on {server.base_url} (log: {log_path})")
    yield server
    server.stop()


@pytest.fixture
def target(vllm_server) -> Target:
    return Target(vllm_server.base_url, vllm_server.config.served_model_name)


@pytest.fixture
def http():
    with httpx.Client(timeout=60) as client:
        yield client
