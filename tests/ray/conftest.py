"""Fixtures for the tests on a real Ray cluster (run by `make test-ray`, which installs the ``ray`` extra).

One cluster for the session: a head and a worker node, each its own ``ray start`` process on loopback
(``ragcache_testing.ray_cluster``), with a real redis-server (L2 and the single-flight locks) and a real
Milvus server (``MilvusLiteServer``, what ``ragcache milvus-server`` runs: L3 and the knowledge base) that
every actor shares. Without Ray installed the tests skip, except under CI (CI=true), where a skipped Ray
test is a failure: CI must prove this path works.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

# Texts and collections are unique per test, so one test's vectors never serve another's (L2 and L3 live as
# long as the session); the actors' L1 is small, so repeats across batches show up in L2 too.
L1_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """The cluster, with this process connected to it as the driver."""
    # find_spec("ray.data"), not "ray": this folder is named ray too, and would pass for a namespace package.
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.data") is None:
        pytest.skip("Ray is not installed: run `make test-ray` (installs the ray extra)")
    import ray

    from ragcache_testing.ray_cluster import NODE_ENV, RayCluster

    os.environ.update(NODE_ENV)  # the driver, like the nodes: no token auth on the loopback cluster
    # Two logical CPUs a node: one for an actor, one for Ray Data's read tasks (ragcache_testing.ray_cluster).
    cluster = RayCluster(num_nodes=2, num_cpus=2, log_dir=tmp_path_factory.mktemp("ray-logs")).start()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory):
    from ragcache.storage.embedded_milvus import MilvusLiteServer

    server = MilvusLiteServer(tmp_path_factory.mktemp("milvus-server") / "shared.db")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ray_settings(ray_cluster, redis_server, milvus_server, tmp_path_factory):
    """Settings every actor and the driver share: the session's Redis and Milvus server by URL."""
    from ragcache.settings import Settings

    return Settings(redis_url=redis_server, milvus_uri=milvus_server.url, data_dir=tmp_path_factory.mktemp("ray-data"),
                    l1_bytes=L1_BYTES)
