"""Bulk embedding on a real two-node Ray cluster through the shared cache: what the actors stored is what
the in-process cache reads back, bit for bit (same keys in L2), an independent computation agrees to a
tolerance, each distinct text is computed once across both actors, and a second
run computes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from ragcache import open_cache

pytestmark = pytest.mark.ray

NUM_DISTINCT = 40
NUM_TEXTS = 120  # each text three times, spread over the batches of both actors
# Largest difference per component between two computations of one text in different processes (seen: 1.5e-7).
COMPUTE_TOLERANCE = 1e-5


def _corpus() -> list[str]:
    return [f"embed test passage {i % NUM_DISTINCT}: caches keep what was computed once" for i in range(NUM_TEXTS)]


def _embed(ray_settings):
    import ray

    from ragcache.ray import embed_dataset, embed_report

    dataset = ray.data.from_items([{"text": text, "row": row} for row, text in enumerate(_corpus())], override_num_blocks=4)
    embedded = embed_dataset(dataset, "text", settings=ray_settings, num_actors=2, batch_size=16).materialize()
    return embedded, embed_report(embedded, "text", settings=ray_settings)


@pytest.fixture(scope="module")
def first_run(ray_settings):
    # What this test pins is single flight while the shared level answers, not the fault path (test_ray_outage):
    # a Redis call over its 0.5 s deadline counts as a failure, turns single flight off and skips that L2 write, and
    # on 2 cores running two Ray nodes, two 1-CPU actors and the stores that happened once in three fresh-clone CI
    # runs (50 computed of 40 distinct, 6 served by L3 that L2 lacked). The deadlines stay hang detectors, longer.
    return _embed(ray_settings.replace(redis_timeout_s=5.0, single_flight_wait_ms=60_000))


def test_each_distinct_text_is_computed_once_across_actors_and_the_vectors_are_the_caches(first_run, ray_settings, redis_server):
    embedded, report = first_run

    assert (report.texts, report.distinct) == (NUM_TEXTS, NUM_DISTINCT)
    assert report.computed == NUM_DISTINCT  # single flight across the two actors: not once per actor
    assert sum(report.served.values()) == NUM_TEXTS
    assert report.served["compute"] == NUM_DISTINCT
    rows = sorted(embedded.take_all(), key=lambda row: row["row"])
    assert [row["text"] for row in rows] == _corpus()  # every row once, none lost or repeated
    got = np.stack([row["embedding"] for row in rows])
    # What the actors stored under a key is what every reader of that key gets, bit for bit: the driver's own
    # cache, over the same L2 (L3 off, so every vector comes from what the actors wrote to Redis).
    with open_cache(ray_settings.replace(milvus_uri="off")) as shared:
        result = shared.embed_detailed(_corpus())
    assert result.served["compute"] == 0 and result.served["L2"] == NUM_TEXTS  # all of it read from what the actors wrote
    read_back = np.asarray(result.vectors)
    assert got.dtype == read_back.dtype
    assert np.array_equal(got.view(np.uint32), read_back.view(np.uint32))
    # A computation in another process agrees to the stated tolerance, not bit for bit: a 1-CPU actor runs torch
    # with other thread counts and batch shapes, so float reductions differ in the last bits (docs/ray.md).
    with open_cache(ray_settings.replace(redis_url="off", milvus_uri="off")) as local:
        expected = np.asarray(local.embed(_corpus()))
        keys = local.space.keys(_corpus()[:NUM_DISTINCT])
    assert got.dtype == expected.dtype
    assert np.abs(got - expected).max() <= COMPUTE_TOLERANCE
    client = redis.Redis.from_url(redis_server)
    try:
        assert client.exists(*keys) == NUM_DISTINCT  # the actors wrote L2 under the in-process cache's keys
    finally:
        client.close()


def test_a_second_run_computes_nothing(first_run, ray_settings):
    embedded, report = _embed(ray_settings)

    assert report.computed == 0
    assert report.texts == NUM_TEXTS
    assert set(report.served) <= {"L1", "L2", "L3"}
    assert embedded.count() == NUM_TEXTS
