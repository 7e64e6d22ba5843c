"""A Redis that stops answering while a Ray job runs (SIGSTOP: connections accepted, nothing answered, the common
production failure) makes the job slower, never wrong: each actor's calls to it end at their deadline, its breaker
opens, and the vectors come from the next level (the Milvus server) bit for bit, with nothing computed again."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from ragcache import open_cache
from ragcache.storage.embedded_redis import EmbeddedRedis

pytestmark = pytest.mark.ray

TEXTS = [f"outage test passage {i}: a level that hangs is a miss, not an error" for i in range(24)]


def _embed(settings):
    import ray

    from ragcache.ray import embed_dataset, embed_report

    dataset = ray.data.from_items([{"text": text, "row": row} for row, text in enumerate(TEXTS)], override_num_blocks=2)
    embedded = embed_dataset(dataset, "text", settings=settings, num_actors=2, batch_size=8).materialize()
    return sorted(embedded.take_all(), key=lambda row: row["row"]), embed_report(embedded, "text", settings=settings)


def test_a_redis_that_hangs_mid_job_costs_time_not_vectors(ray_settings, tmp_path):
    redis = EmbeddedRedis()  # this test's own: it is the one stopped
    settings = ray_settings.replace(redis_url=redis.url)
    try:
        _, first = _embed(settings)
        assert first.computed == len(TEXTS)
        os.kill(redis.process.pid, signal.SIGSTOP)
        try:
            rows, report = _embed(settings)
        finally:
            os.kill(redis.process.pid, signal.SIGCONT)
    finally:
        redis.stop()

    assert report.computed == 0  # L3 had every vector: nothing paid for twice
    assert report.served.get("L3", 0) == len(TEXTS) and report.served.get("L2", 0) == 0
    with open_cache(ray_settings.replace(redis_url="off", milvus_uri="off")) as local:
        expected = np.asarray(local.embed(TEXTS))
    got = np.stack([row["embedding"] for row in rows])
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
