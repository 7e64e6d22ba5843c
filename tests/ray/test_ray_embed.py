"""Bulk embedding on a real two-node Ray cluster through the shared cache: the vectors are the in-process
cache's bit for bit (same keys in L2), each distinct text is computed once across both actors, and a second
run computes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from ragcache.build import open_cache

pytestmark = pytest.mark.ray

NUM_DISTINCT = 40
NUM_TEXTS = 120  # each text three times, spread over the batches of both actors


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
    return _embed(ray_settings)


def test_each_distinct_text_is_computed_once_across_actors_and_the_vectors_are_the_caches(first_run, ray_settings, redis_server):
    embedded, report = first_run

    assert (report.texts, report.distinct) == (NUM_TEXTS, NUM_DISTINCT)
    assert report.computed == NUM_DISTINCT  # single flight across the two actors: not once per actor
    assert sum(report.served.values()) == NUM_TEXTS
    assert report.served["compute"] == NUM_DISTINCT
    rows = sorted(embedded.take_all(), key=lambda row: row["row"])
    assert [row["text"] for row in rows] == _corpus()  # every row once, none lost or repeated
    got = np.stack([row["embedding"] for row in rows])
    # The same settings without L2/L3: the space (and so every key) is the one /embed serves.
    with open_cache(ray_settings.replace(redis_url="off", milvus_uri="off")) as local:
        expected = np.asarray(local.embed(_corpus()))
        keys = local.space.keys(_corpus()[:NUM_DISTINCT])
    assert got.dtype == expected.dtype
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
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
