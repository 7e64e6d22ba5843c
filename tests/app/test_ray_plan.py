"""The Ray path's logic without a cluster (those tests are in tests/ray, `make test-ray`): the actor plan for a
cluster's resources, how a run's figures add up, and that ``ragcache.ray`` imports without Ray."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ragcache.core.cache import EmbedResult
from ragcache.errors import ConfigError
from ragcache.ray.actors import served_once
from ragcache.ray.plan import CPU_BATCH, GPU_BATCH, REMOTE_BATCH, ActorPlan, plan_actors
from ragcache.ray.reports import EmbedTally, IngestReport

LEVELS = ("L1", "L2", "L3", "compute")


def test_a_local_model_gets_one_actor_per_gpu():
    assert plan_actors(cluster_cpus=32, cluster_gpus=4, remote=False) == ActorPlan(4, GPU_BATCH, 1, 1)


def test_a_local_model_on_cpus_leaves_one_cpu_for_the_reads():
    assert plan_actors(cluster_cpus=4, cluster_gpus=0, remote=False) == ActorPlan(3, CPU_BATCH, 1, 0)
    assert plan_actors(cluster_cpus=1, cluster_gpus=0, remote=False) == ActorPlan(1, CPU_BATCH, 1, 0)


def test_large_nodes_get_actors_of_four_cpus_and_a_cpu_device_ignores_gpus():
    assert plan_actors(cluster_cpus=17, cluster_gpus=2, remote=False, device="cpu") == ActorPlan(4, CPU_BATCH, 4, 0)


def test_a_remote_model_gets_light_actors_and_no_gpu():
    assert plan_actors(cluster_cpus=5, cluster_gpus=8, remote=True) == ActorPlan(8, REMOTE_BATCH, 0.5, 0)
    assert plan_actors(cluster_cpus=1000, cluster_gpus=0, remote=True).num_actors == 32


def test_given_sizes_win_and_bad_ones_are_refused():
    assert plan_actors(cluster_cpus=4, cluster_gpus=0, remote=False, num_actors=2, batch_size=8) == ActorPlan(2, 8, 1, 0)
    with pytest.raises(ConfigError):
        plan_actors(cluster_cpus=4, cluster_gpus=0, remote=False, num_actors=0)
    with pytest.raises(ConfigError):
        plan_actors(cluster_cpus=4, cluster_gpus=0, remote=False, batch_size=0)


def test_a_text_repeated_in_a_batch_counts_as_computed_once():
    # The cache marks every input of a computed key computed; its repeats were served by that one computation.
    result = EmbedResult(np.zeros((5, 2)), np.array([3, 1, 3, 3, 0], dtype=np.int8), LEVELS)
    levels = served_once(result, ["a", "b", "c", "a", "d"])
    assert levels.tolist() == [3, 1, 3, 0, 0]


def test_the_embed_tally_counts_distinct_texts_and_the_tokens_that_hits_saved():
    tally = EmbedTally(price_per_million_tokens=2.0)
    tally.add(["x", "y", "x"], ["compute", "compute", "L1"], [10, 20, 10])
    tally.add(["y", "z"], ["L2", "L3"], [20, 5])
    report = tally.report(wall_s=1.5)
    assert (report.texts, report.distinct, report.computed) == (5, 3, 2)
    assert report.served == {"compute": 2, "L1": 1, "L2": 1, "L3": 1}
    assert (report.tokens_saved, report.money_saved) == (35, 0.00007)
    assert report.hit_rate == pytest.approx(0.6)


def test_a_local_models_tally_has_no_token_figures():
    tally = EmbedTally()
    tally.add(["x"], ["compute"])
    assert (tally.report().tokens_saved, tally.report().money_saved) == (None, None)


def test_an_ingest_report_adds_up_the_batches():
    rows = [
        {"num_received": 4, "num_unchanged": 1, "num_added": 2, "num_replaced": 1, "num_computed": 2, "served": {"compute": 2, "L2": 1}},
        {"num_received": 3, "num_unchanged": 3, "num_added": 0, "num_replaced": 0, "num_computed": 0, "served": {}},
    ]
    report = IngestReport.of("docs", rows, deleted=2)
    assert (report.received, report.unchanged, report.added, report.replaced, report.deleted, report.computed) == (7, 4, 2, 1, 2, 2)
    assert report.served == {"compute": 2, "L2": 1}
    assert report.written == 5


def test_the_library_and_ragcache_ray_import_without_ray():
    code = "import sys, ragcache.ray, ragcache_cli.cli; assert 'ray' not in sys.modules, 'ray was imported'"
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr[-2000:]


def test_actors_are_sent_no_api_key_of_the_service_nor_the_rerankers():
    from ragcache.ray.pipeline import actor_settings
    from ragcache.settings import Settings

    settings = Settings(api_key="sk-service-key", api_keys='[{"key": "sk-tenant-key", "scopes": ["embed"]}]',
                        rerank_api_key="sk-rerank-key", redis_url="redis://127.0.0.1:1/0")

    sent = actor_settings(settings)

    assert (sent.access.api_key, sent.access.api_keys, sent.access.api_keys_file, sent.rerank.rerank_api_key) == (None,) * 4
    assert sent.levels.redis_url == "redis://127.0.0.1:1/0"  # what the actors do use travels unchanged
    assert not any(secret in repr(sent.flat()) for secret in ("sk-service-key", "sk-tenant-key", "sk-rerank-key"))
