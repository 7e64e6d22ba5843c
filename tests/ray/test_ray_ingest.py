"""Ingest on a real two-node Ray cluster: the actors embed through the shared cache and upsert straight into
the Milvus server, with ``ingest --sync``'s semantics. One corpus goes through three runs in order: the first
with an actor killed mid-run, a re-run through ``ragcache ingest --ray`` that computes and writes nothing, and a
sync after a change read from Parquet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

COLLECTION = "raydocs"
CHUNK_CHARS = 80  # each paragraph below is a chunk of its own
NUM_FILES = 6
FOOTER = "Shared footer: every file of this corpus ends with this same paragraph."
NUM_DOCUMENTS = NUM_FILES * 4
NUM_DISTINCT = NUM_FILES * 3 + 1  # the footer is one text under six ids


def _write_corpus(folder: Path) -> None:
    for number in range(NUM_FILES):
        paragraphs = [f"File {number}, paragraph {p}: ingest on Ray through the cache." for p in range(3)]
        (folder / f"doc{number}.md").write_text("\n\n".join([*paragraphs, FOOTER]), encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ray-corpus")
    _write_corpus(folder)
    return folder


@pytest.fixture(scope="module")
def knowledge(ray_settings):
    from ragcache.retrieval.knowledge import KnowledgeBase
    from ragcache.storage.stores import Stores

    stores = Stores.open(ray_settings)
    yield KnowledgeBase(stores.milvus, redis=stores.redis)
    stores.close()


def _stored(knowledge) -> list[str]:
    return sorted(knowledge.list_ids(COLLECTION))


def test_an_actor_killed_mid_run_loses_and_duplicates_no_document(corpus, ray_settings, redis_server, knowledge):
    import redis

    from ragcache.ray import ingest_path
    from ragcache.retrieval.ingest import iter_documents
    from ragcache_testing.ray_cluster import KillOnce

    kill_key = "test:ray:killed"
    report = ingest_path(corpus, COLLECTION, chunk_chars=CHUNK_CHARS, settings=ray_settings, sync=True, num_actors=2,
                         batch_size=4, quiet=True, after_batch=KillOnce(redis_server, kill_key))

    client = redis.Redis.from_url(redis_server)
    try:
        assert client.get(kill_key) is not None  # an actor did die, after writing its batch
    finally:
        client.close()
    # Each batch is counted once, as the attempt that returned: the killed one's retry found its documents stored.
    assert report.received == NUM_DOCUMENTS
    assert report.added + report.unchanged == NUM_DOCUMENTS
    assert 1 <= report.unchanged <= 4  # the retried batch, and only it
    assert (report.replaced, report.deleted) == (0, 0)
    # The killed attempt's computations are not in the report (its row never came back); the rest computed once.
    assert NUM_DISTINCT - 4 <= report.computed <= NUM_DISTINCT
    expected = sorted(document["id"] for document in iter_documents(corpus, max_chars=CHUNK_CHARS))
    assert len(expected) == NUM_DOCUMENTS
    assert _stored(knowledge) == expected  # none lost, none twice
    assert knowledge.collection_info(COLLECTION).num_documents == NUM_DOCUMENTS


def test_a_rerun_through_the_cli_computes_nothing_and_writes_nothing(corpus, ray_cluster, ray_settings, knowledge):
    from ragcache_testing.ray_cluster import NODE_ENV

    env = dict(os.environ, **NODE_ENV, RAGCACHE_REDIS_URL=ray_settings.levels.redis_url, RAGCACHE_MILVUS_URI=ray_settings.levels.milvus_uri,
               RAGCACHE_DATA_DIR=str(ray_settings.levels.data_dir), RAGCACHE_L1_BYTES=str(ray_settings.levels.l1_bytes))
    command = [sys.executable, "-m", "ragcache_cli.cli", "ingest", str(corpus), "--collection", COLLECTION, "--ray", ray_cluster.address,
               "--sync", "--quiet", "--chunk-chars", str(CHUNK_CHARS), "--batch", "8", "--actors", "1"]
    finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)

    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (f"{NUM_DOCUMENTS} documents in {COLLECTION!r}: {NUM_DOCUMENTS} unchanged, 0 replaced, 0 added, 0 deleted "
            "(0 embeddings computed, the rest from cache)") in finished.stdout
    assert knowledge.collection_info(COLLECTION).num_documents == NUM_DOCUMENTS


def test_a_sync_from_parquet_after_a_change_replaces_one_and_deletes_a_removed_source(corpus, ray_settings, knowledge, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from ragcache.ray import ingest_dataset
    from ragcache.retrieval.ingest import iter_documents

    changed = corpus / "doc0.md"
    changed.write_text(changed.read_text(encoding="utf-8").replace("paragraph 1:", "paragraph 1 (revised):"), encoding="utf-8")
    (corpus / f"doc{NUM_FILES - 1}.md").unlink()
    documents = list(iter_documents(corpus, max_chars=CHUNK_CHARS))
    table = pa.table({"id": [d["id"] for d in documents], "text": [d["text"] for d in documents],
                      "metadata": [json.dumps(d["metadata"]) for d in documents]})
    pq.write_table(table, tmp_path / "documents.parquet")

    report = ingest_dataset(ray.data.read_parquet(str(tmp_path / "documents.parquet")), COLLECTION, settings=ray_settings,
                            sync=True, num_actors=2, batch_size=8, quiet=True)

    assert report.received == NUM_DOCUMENTS - 4
    assert (report.replaced, report.added, report.deleted) == (1, 0, 4)
    assert report.unchanged == NUM_DOCUMENTS - 4 - 1
    assert report.computed == 1  # only the revised paragraph
    assert report.written == 5
    assert _stored(knowledge) == sorted(d["id"] for d in documents)
