"""Milvus over the network: L3 and the knowledge base through an ``http://`` URI, the client path of Milvus
standalone, against a real Milvus Lite server process (``MilvusLiteServer``, ``ragcache milvus-server``),
including two service processes that share it.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
import torch
from pymilvus import MilvusClient

from ragcache.build import build_cache
from ragcache.retrieval.knowledge import KnowledgeBase
from ragcache.settings import Settings
from ragcache.storage.embedded_milvus import MilvusLiteServer
from ragcache.storage.embedded_redis import free_port
from ragcache.storage.stores import Stores, open_milvus
from ragcache.tiers import MilvusTier
from ragcache_testing.replicas import start_replicas, stop_replicas
from ragcache_testing.service import served

# The tier contract every level passes, run here against L3 over the network (``make_tier`` below).
from tests.tiers.test_tier_contract import (  # noqa: F401 - collected as tests of this module
    DIM,
    test_empty_and_all_missing_batches,
    test_misses_are_absent_and_hits_keep_their_positions,
    test_put_overwrites,
    test_round_trip_is_bit_exact,
)

DOCS = [
    {"id": "kv", "text": "vLLM keeps the attention keys and values of a prompt prefix in its KV cache.", "metadata": {"topic": "llm"}},
    {"id": "bread", "text": "Knead the dough for ten minutes and let it rise before baking the bread.", "metadata": {"topic": "cooking"}},
    {"id": "redis", "text": "Redis is an in-memory key-value store often used as a shared cache.", "metadata": {"topic": "databases"}},
]


@pytest.fixture(scope="module")
def milvus_server(tmp_path_factory):
    with MilvusLiteServer(tmp_path_factory.mktemp("milvus-server") / "shared.db") as server:
        yield server


@pytest.fixture(scope="module")
def network_client(milvus_server):
    client = open_milvus(milvus_server.url)
    yield client
    client.close()


@pytest.fixture
def make_tier(network_client):
    def make(dtype: torch.dtype = torch.float32):
        return MilvusTier(network_client, space_id=uuid.uuid4().hex[:16], dim=DIM, dtype=dtype)

    return make


def network_settings(url: str, **overrides) -> Settings:
    return Settings(redis_url="off", milvus_uri=url, write_behind=False, **overrides)


def test_l3_through_the_uri_setting_is_shared_by_two_clients(milvus_server, encoder):
    """Two caches, each with its own L1 and its own Milvus client opened from the URI: one's L3 is the other's."""
    texts = [f"network L3 {uuid.uuid4().hex}" for _ in range(5)]
    first_stores, second_stores = Stores.open(network_settings(milvus_server.url)), Stores.open(network_settings(milvus_server.url))
    with build_cache(network_settings(milvus_server.url), first_stores, encoder, on_close=first_stores.close) as first, \
            build_cache(network_settings(milvus_server.url), second_stores, encoder, on_close=second_stores.close) as second:
        assert first.level_names == ("L1", "L3", "compute")
        computed = first.embed_detailed(texts)
        assert computed.served == {"L1": 0, "L3": 0, "compute": 5}
        from_l3 = second.embed_detailed(texts)
        assert from_l3.served == {"L1": 0, "L3": 5, "compute": 0}
        assert (from_l3.vectors == computed.vectors).all()


def test_knowledge_base_ingest_and_search_over_the_network(network_client, encoder):
    collection = f"net_{uuid.uuid4().hex[:8]}"
    cache = build_cache(network_settings("off"), Stores(None, None), encoder)
    kb = KnowledgeBase(network_client)
    added = kb.add_documents(collection, DOCS, cache=cache)
    assert added.num_received == 3
    result = kb.search(collection, "Which store keeps data in memory for a shared cache?", cache=cache, top_k=2)
    assert [hit.id for hit in result.hits][0] == "redis" and len(result.hits) == 2
    filtered = kb.search(collection, "attention keys", cache=cache, top_k=3, filter='metadata["topic"] == "cooking"')
    assert [hit.id for hit in filtered.hits] == ["bread"]
    kb.drop_collection(collection)
    cache.close()


def test_milvus_server_command_serves_a_database_until_sigterm(tmp_path):
    port = free_port()
    command = [sys.executable, "-c", "import sys; from ragcache_cli.cli import main; sys.exit(main())",
               "milvus-server", "--db", str(tmp_path / "cli.db"), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = process.stdout.readline()
        assert f"http://127.0.0.1:{port}" in banner, process.stderr.read() if process.poll() is not None else banner
        client = MilvusClient(f"http://127.0.0.1:{port}")
        client.create_collection("cli_check", dimension=4)
        client.insert("cli_check", [{"id": 7, "vector": [0.1, 0.2, 0.3, 0.4]}])
        assert [row["id"] for row in client.get("cli_check", ids=[7])] == [7]
        client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        process.stdout.close()
        process.stderr.close()
    with pytest.raises(OSError):  # the milvus child went with it: nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_milvus_server_command_rejects_a_path_that_is_not_a_database(tmp_path, capsys):
    from ragcache_cli.cli import main

    assert main(["milvus-server", "--db", str(tmp_path / "folder")]) == 1
    assert "ending in .db" in capsys.readouterr().err


# ---- two service processes on one Milvus server (L2 off, so every shared hit is an L3 hit) ------------------


@pytest.fixture(scope="module")
def two_services(milvus_server, tmp_path_factory):
    replicas = start_replicas(tmp_path_factory.mktemp("services"), 2, redis_url="off", milvus_url=milvus_server.url)
    yield replicas
    stop_replicas(replicas)


def test_documents_ingested_through_one_service_are_found_through_the_other(two_services):
    first, second = two_services
    collection = f"shared_{uuid.uuid4().hex[:8]}"
    first.post("/documents", {"collection": collection, "documents": DOCS})
    found = second.post("/search", {"collection": collection, "query": "an in-memory key-value store", "top_k": 1}).json()
    assert [hit["id"] for hit in found["hits"]] == ["redis"]
    listed = second.client.get("/collections").json()["collections"]
    assert any(entry["name"] == collection and entry["num_documents"] == 3 for entry in listed)


def test_l3_entries_written_by_one_service_are_hits_for_the_other(two_services, network_client, encoder):
    first, second = two_services
    texts = [f"shared through L3 {uuid.uuid4().hex}" for _ in range(6)]
    assert served(first.post("/embed", {"inputs": texts}))["Compute"] == 6
    space = first.client.get("/stats").json()["models"][Settings().space.model]["space"]
    assert space["space_id"] == encoder.space.space_id  # the test computes the service's keys
    l3 = MilvusTier(network_client, space_id=encoder.space.space_id, dim=encoder.space.dim, dtype=torch.float32)
    keys = encoder.space.keys(texts)
    deadline = time.monotonic() + 60
    while len(l3.get_many(keys).index) < len(keys):  # the first service writes L3 behind its answer
        assert time.monotonic() < deadline, "the first service never wrote its vectors to L3"
        time.sleep(0.1)
    response = second.post("/embed", {"inputs": texts})
    assert served(response) == {"L1": 0, "Disk": 0, "L2": 0, "L3": 6, "Compute": 0}
    assert response.json() == first.post("/embed", {"inputs": texts}).json()
