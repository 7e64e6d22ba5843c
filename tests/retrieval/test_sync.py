"""Incremental ingest: content hashes skip unchanged documents, changed ones are replaced, and a sync deletes
what is gone from its source; in the library (real Milvus Lite, the real model), over HTTP and in the CLI."""

from __future__ import annotations

import json

import httpx
import pytest

from ragcache.errors import InvalidInputError
from ragcache.retrieval.documents import Document, content_hash
from ragcache.retrieval.knowledge import KnowledgeBase
from ragcache.retrieval.sync import SyncOptions
from ragcache.settings import Settings
from ragcache_cli.cli import main
from tests.live_server import LiveServer
from tests.retrieval.conftest import earlier_collection


def docs(source: str, texts: list[str], **metadata) -> list[dict]:
    return [{"id": f"{source}#{n}", "text": text, "metadata": {"source": source, **metadata}} for n, text in enumerate(texts)]


class CountingMilvus:
    """The real Milvus client, with its writes counted (to show that an unchanged re-ingest writes nothing)."""

    def __init__(self, client):
        self._client = client
        self.num_upserts = 0

    def upsert(self, *args, **kwargs):
        self.num_upserts += 1
        return self._client.upsert(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.fixture
def milvus(milvus_client):
    return CountingMilvus(milvus_client)


def test_content_hash_covers_text_and_metadata_but_not_key_order():
    base = Document("a", "text", {"x": 1, "y": [1, 2]})
    assert content_hash(base) == content_hash(Document("b", "text", {"y": [1, 2], "x": 1}))
    assert content_hash(base) != content_hash(Document("a", "text ", {"x": 1, "y": [1, 2]}))
    assert content_hash(base) != content_hash(Document("a", "text", {"x": 2, "y": [1, 2]}))


def test_reingest_unchanged_embeds_and_writes_nothing_and_a_change_replaces(milvus, cache):
    kb = KnowledgeBase(milvus)
    first = kb.add_documents("sync_lib", docs("a.md", ["one", "two", "three"]), cache=cache)
    assert (first.num_inserted, first.num_replaced, first.num_unchanged) == (3, 0, 0)
    num_upserts = milvus.num_upserts
    again = kb.add_documents("sync_lib", docs("a.md", ["one", "two", "three"]), cache=cache)
    assert (again.num_inserted, again.num_replaced, again.num_unchanged, again.num_computed) == (0, 0, 3, 0)
    assert again.served == {} and milvus.num_upserts == num_upserts
    changed = docs("a.md", ["one", "two (edited)", "three"])
    changed[0]["metadata"]["lang"] = "en"  # metadata counts too
    result = kb.add_documents("sync_lib", changed + docs("b.md", ["new"]), cache=cache)
    assert (result.num_inserted, result.num_replaced, result.num_unchanged) == (1, 2, 1)
    assert result.num_computed == 2  # the edited text and the new one; "one" came from the cache
    assert milvus.num_upserts == num_upserts + 1
    hits = kb.search("sync_lib", "two (edited)", cache=cache, top_k=1).hits
    assert hits[0].id == "a.md#1" and hits[0].text == "two (edited)"


def test_incremental_cleanup_deletes_the_chunks_a_source_no_longer_has(milvus, cache):
    kb = KnowledgeBase(milvus)
    kb.add_documents("sync_inc", docs("a.md", ["one", "two", "three"]) + docs('b "x".md', ["other"]), cache=cache)
    result = kb.add_documents("sync_inc", docs("a.md", ["one", "two"]), cache=cache, sync=SyncOptions("incremental"))
    assert (result.num_unchanged, result.num_deleted) == (2, 1)
    assert sorted(kb.list_ids("sync_inc")) == ["a.md#0", "a.md#1", 'b "x".md#0']  # another source is left alone


def test_full_cleanup_deletes_everything_not_sent_within_its_scope(milvus, cache):
    kb = KnowledgeBase(milvus)
    kb.add_documents("sync_full", docs("a.md", ["one", "two"], lang="en") + docs("b.md", ["drei"], lang="de"), cache=cache)
    scoped = kb.add_documents(
        "sync_full", docs("a.md", ["one"], lang="en"), cache=cache, sync=SyncOptions("full", 'metadata["lang"] == "en"')
    )
    assert scoped.num_deleted == 1 and sorted(kb.list_ids("sync_full")) == ["a.md#0", "b.md#0"]
    everything = kb.add_documents("sync_full", docs("c.md", ["new"]), cache=cache, sync=SyncOptions("full"))
    assert (everything.num_inserted, everything.num_deleted) == (1, 2)
    assert kb.list_ids("sync_full") == ["c.md#0"]


def test_sync_options_refuse_what_cannot_work():
    with pytest.raises(InvalidInputError) as raised:
        SyncOptions("everything")  # type: ignore[arg-type]
    assert raised.value.field == "sync.cleanup"
    with pytest.raises(InvalidInputError) as raised:
        SyncOptions("incremental", 'metadata["lang"] == "en"')
    assert raised.value.field == "sync.scope"


KEYS = {"admin": "admin-secret-key-1", "ingester": "ingest-secret-key-1"}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    keys = {"keys": [{"name": "admin", "key": KEYS["admin"], "scopes": "*"},
                     {"name": "ingester", "key": KEYS["ingester"], "scopes": ["ingest", "search"]}]}
    settings = Settings(redis_url="off", data_dir=tmp_path_factory.mktemp("sync"), api_keys=json.dumps(keys))
    with LiveServer(settings) as server:
        yield server


def post(live, key, body, path="/documents"):
    return httpx.post(live.url + path, json=body, headers={"Authorization": f"Bearer {KEYS[key]}"}, timeout=60)


def test_http_ingest_reports_unchanged_replaced_added_deleted(live):
    body = {"collection": "sync_http", "documents": docs("a.md", ["one", "two", "three"])}
    assert post(live, "ingester", body).json()["num_inserted"] == 3
    body["documents"] = docs("a.md", ["one", "two!"])
    refused = post(live, "ingester", {**body, "sync": {"cleanup": "incremental"}})
    assert refused.status_code == 403 and refused.json()["error"]["field"] == "sync"
    answer = post(live, "admin", {**body, "sync": {"cleanup": "incremental"}}).json()
    assert {k: answer[k] for k in ("num_unchanged", "num_replaced", "num_inserted", "num_deleted")} == {
        "num_unchanged": 1, "num_replaced": 1, "num_inserted": 0, "num_deleted": 1}
    assert sorted(post(live, "ingester", {"collection": "sync_http"}, "/documents/ids").json()["ids"]) == ["a.md#0", "a.md#1"]
    bad = post(live, "admin", {**body, "sync": {"cleanup": "full", "scope": "metadata[[["}})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "sync.scope"


def test_cli_ingest_sync_deletes_files_gone_from_the_folder(live, tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for n in range(3):
        (folder / f"f{n}.md").write_text(f"File number {n}.\n\nIts second paragraph.")
    args = ["ingest", str(folder), "--collection", "sync_cli", "--url", live.url, "--api-key", KEYS["admin"], "--quiet"]
    assert main(args) == 0
    assert "3 added" in capsys.readouterr().out
    assert main(args + ["--sync"]) == 0
    assert "3 unchanged, 0 replaced, 0 added, 0 deleted (0 embeddings computed" in capsys.readouterr().out
    (folder / "f1.md").unlink()
    (folder / "f2.md").write_text("File number 2, edited.")
    assert main(args + ["--sync"]) == 0
    assert "1 unchanged, 1 replaced, 0 added, 1 deleted" in capsys.readouterr().out
    assert main(args[:-1] + ["--scope", "x"]) == 1


def test_a_collection_made_before_content_hashes_is_compared_by_its_stored_text(milvus_client, cache):
    """Collections written before the content_hash field existed: the stored text and metadata are hashed."""
    name = "sync_old"
    earlier_collection(milvus_client, cache, name)
    kb = KnowledgeBase(milvus_client)
    assert kb.add_documents(name, docs("a.md", ["one", "two"]), cache=cache).num_inserted == 2
    again = kb.add_documents(name, docs("a.md", ["one", "two, edited"]), cache=cache)
    assert (again.num_unchanged, again.num_replaced, again.num_inserted) == (1, 1, 0)


def test_a_collection_of_format_2_keeps_its_xxh3_primary_keys(milvus_client, cache):
    """Format 2 named documents by xxh3-128 of their id (format 3: BLAKE2b, which chosen ids cannot collide). A
    collection written then is still read with its own hash: a re-sent document replaces its row, none is doubled."""
    import xxhash

    name = "sync_format2"
    milvus_collection = earlier_collection(milvus_client, cache, name, format="ragcache.knowledge/2", content_hash=True)
    kb = KnowledgeBase(milvus_client)
    assert kb.add_documents(name, docs("a.md", ["one", "two"]), cache=cache).num_inserted == 2
    stored = milvus_client.query(milvus_collection, filter="", output_fields=["pk", "id"], limit=10)
    assert sorted(row["pk"] for row in stored) == sorted(xxhash.xxh3_128_hexdigest(f"a.md#{n}".encode()) for n in range(2))
    again = kb.add_documents(name, docs("a.md", ["one", "two, edited"]), cache=cache)
    assert (again.num_unchanged, again.num_replaced, again.num_inserted) == (1, 1, 0)
    assert len(milvus_client.query(milvus_collection, filter="", output_fields=["id"], limit=10)) == 2
