"""Milvus failing: a Milvus Lite server process stopped under load, and L3 rows that are not this space's.

While Milvus is down, /embed keeps answering (L3 is a cache level: a miss), while /search and ingest,
which need the knowledge base itself, answer 503 with a message that names Milvus; both work again once
it is back, and every document acknowledged with a 2xx is in the collection. Measured times are printed
(``pytest -s``) for docs/reliability.md, never asserted.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch
from pymilvus import MilvusClient

from ragcache.core.keys import EmbeddingSpace
from ragcache.retrieval.documents import milvus_collection_name
from ragcache.settings import Settings
from ragcache.storage.embedded_milvus import MilvusLiteServer
from ragcache.tiers.milvus import MilvusTier
from ragcache_bench.load import LoadRunner, Workload, summarize
from tests.live_server import LiveServer

COLLECTION = "faults"
OUTAGE_S = 4.0


class Ingester:
    """One client adding 4 new documents per request until stopped; remembers which ids it sent and which got a 2xx."""

    def __init__(self, url: str):
        self.client = httpx.Client(base_url=url, timeout=60)
        self.sent: list[str] = []
        self.acknowledged: list[str] = []
        self.statuses: list[tuple[float, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            ids = [f"ingest-{number + i}" for i in range(4)]
            number += 4
            documents = [{"id": doc_id, "text": f"document {doc_id} about cache levels"} for doc_id in ids]
            started = time.monotonic()
            self.sent.extend(ids)
            response = self.client.post("/documents", json={"collection": COLLECTION, "documents": documents})
            self.statuses.append((started, response.status_code, response.text[:300]))
            if response.is_success:
                self.acknowledged.extend(ids)
            else:
                time.sleep(0.05)

    def __enter__(self) -> Ingester:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        self.client.close()


def stored_ids(url: str, ids: list[str]) -> set[str]:
    """Which of ``ids`` the collection holds, asked of Milvus directly (not through the service)."""
    client = MilvusClient(url)
    try:
        found: set[str] = set()
        for start in range(0, len(ids), 200):
            batch = ids[start : start + 200]
            rows = client.query(milvus_collection_name(COLLECTION), filter=f"id in {batch!r}".replace("'", '"'), output_fields=["id"])
            found.update(row["id"] for row in rows)
        return found
    finally:
        client.close()


def first_success_after(outcomes, path: str, since: float) -> float | None:
    times = [o.started_s + o.latency_s for o in outcomes if o.endpoint == path and o.ok and o.started_s >= since]
    return min(times) - since if times else None


def test_milvus_stopped_and_restarted_under_load(tmp_path):
    milvus = MilvusLiteServer(tmp_path / "milvus" / "kb.db")
    settings = Settings(redis_url="off", milvus_uri=milvus.url, data_dir=tmp_path / "data")
    try:
        with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
            workload = Workload(collection=COLLECTION, paths=("/embed", "/search"), skew=0, new_fraction=0.05)
            seed = [{"id": f"seed-{i}", "text": text} for i, text in enumerate(workload.hot_texts[:50])]
            assert client.post("/documents", json={"collection": COLLECTION, "documents": seed}).status_code == 200
            with LoadRunner(server.url, workload, clients=3) as load, Ingester(server.url) as ingester:
                time.sleep(2.0)
                milvus.stop()
                stopped_at = time.monotonic()
                time.sleep(OUTAGE_S)
                milvus.start()
                restarted_at = time.monotonic()
                deadline = restarted_at + 60
                while time.monotonic() < deadline and (
                    first_success_after(load.outcomes, "/search", restarted_at) is None
                    or not any(t >= restarted_at and status == 200 for t, status, _ in ingester.statuses)
                ):
                    time.sleep(0.1)
                time.sleep(1.0)
            outcomes = load.stop()
            count = client.get("/collections").json()["collections"][0]["num_documents"]
        found = stored_ids(milvus.url, ingester.sent)
    finally:
        milvus.stop()

    embeds = [o for o in outcomes if o.endpoint == "/embed"]
    searches = [o for o in outcomes if o.endpoint == "/search"]
    searches_down = [o for o in searches if stopped_at <= o.started_s < restarted_at]
    ingests_down = [s for s in ingester.statuses if stopped_at <= s[0] < restarted_at]
    search_back_s = first_success_after(outcomes, "/search", restarted_at)
    ingest_back_s = min((t for t, status, _ in ingester.statuses if t >= restarted_at and status == 200), default=None)
    embeds_down = summarize([o for o in embeds if stopped_at <= o.started_s < restarted_at])
    print(f"\nFAULT milvus-stop ({OUTAGE_S:.0f} s): /embed {len(embeds)} requests, {sum(not o.ok for o in embeds)} failed "
          f"({embeds_down.num_requests} while down: p50 {embeds_down.latency_p50_ms} ms, max {embeds_down.latency_max_ms} ms); "
          f"/search {len(searches)} ({len(searches_down)} while down: {sum(o.status == 503 for o in searches_down)} x 503); "
          f"ingest {len(ingester.statuses)} requests ({len(ingests_down)} while down: {sum(s[1] == 503 for s in ingests_down)} x 503), "
          f"{len(ingester.acknowledged)} documents acknowledged, {len(found)} of those sent stored, collection holds {count}; "
          f"/search back {search_back_s:.2f} s and ingest back {ingest_back_s - restarted_at:.2f} s after the restart")
    assert embeds and all(o.ok for o in embeds), summarize(embeds).first_errors
    assert all(o.status in (200, 503) for o in searches), summarize(searches).first_errors
    assert all(status in (200, 503) for _, status, _ in ingester.statuses)
    unavailable = [o.error for o in searches if o.status == 503] + [text for _, status, text in ingester.statuses if status == 503]
    assert any(o.status == 503 for o in searches_down) and any(s[1] == 503 for s in ingests_down)
    assert all('"type":"unavailable"' in text.replace(" ", "") and "Milvus" in text for text in unavailable)
    assert search_back_s is not None and ingest_back_s is not None
    assert set(ingester.acknowledged) <= found  # nothing acknowledged was lost
    # A request cut off by the stop may have been stored although its answer was a 503 (Milvus took the insert,
    # then went away before it answered): the client's retry with the same ids is an upsert. So the collection holds
    # the seed and what was stored of what was sent, nothing else.
    assert count == len(seed) + len(found)


def test_l3_rows_of_another_dimension_are_never_served_counted_and_replaced(milvus_client):
    space = EmbeddingSpace(model="fake/dims", revision="0", dtype="float32", dim=8, normalize=False, max_seq_length=128)
    keys = space.keys(["one", "two", "three"])
    # Another writer left rows of 4 floats in the collection this space's L3 uses.
    MilvusTier(milvus_client, space_id=space.space_id, dim=4, dtype=torch.float32).put_many(keys, torch.randn(3, 4))
    level = MilvusTier(milvus_client, space_id=space.space_id, dim=8, dtype=torch.float32)
    hits = level.get_many(keys)
    assert hits.index == [] and level.num_corrupt == 3
    vectors = torch.randn(3, 8)
    level.put_many(keys, vectors)  # the cache writes the computed vectors back: replaced
    hits = level.get_many(keys)
    assert hits.index == [0, 1, 2] and torch.equal(hits.vectors, vectors)
    assert level.count() == 3


def test_l3_rows_that_are_not_finite_are_dropped(milvus_client):
    space = EmbeddingSpace(model="fake/nan", revision="0", dtype="float32", dim=4, normalize=False, max_seq_length=128)
    keys = space.keys(["fine", "broken"])
    level = MilvusTier(milvus_client, space_id=space.space_id, dim=4, dtype=torch.float32)
    try:
        level.put_many(keys, torch.tensor([[1.0, 2.0, 3.0, 4.0], [float("nan"), 0.0, 0.0, 0.0]]))
    except Exception as exc:  # noqa: BLE001 - Milvus refusing NaN on insert is as good: it is never stored
        pytest.fail(f"Milvus refused the write rather than storing it: {exc}")
    hits = level.get_many(keys)
    assert hits.index == [0] and level.num_corrupt == 1
    assert level.get_many(keys[1:]).index == [] and level.num_corrupt == 1  # deleted: not counted twice


def test_a_service_started_while_milvus_is_down_serves_embed_and_uses_milvus_once_it_is_up(tmp_path):
    """pymilvus connects when its client is made; a server down at start-up must not stop the service."""
    from ragcache.storage.embedded_redis import free_port

    port = free_port()
    settings = Settings(redis_url="off", milvus_uri=f"http://127.0.0.1:{port}", data_dir=tmp_path / "data")
    document = {"collection": COLLECTION, "documents": [{"id": "late", "text": "Milvus came up after the service"}]}
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        embedded = http.post("/embed", json={"inputs": ["served while Milvus is down"]})
        assert embedded.status_code == 200 and len(embedded.json()[0]) == 384
        refused = http.post("/documents", json=document)
        assert refused.status_code == 503 and "cannot reach the server" in refused.json()["error"]["message"]
        assert http.post("/search", json={"collection": COLLECTION, "query": "q"}).status_code == 503

        with MilvusLiteServer(tmp_path / "late" / "milvus.db", port=port):
            deadline = time.monotonic() + 60
            while (ingested := http.post("/documents", json=document)).status_code == 503 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert ingested.status_code == 200, ingested.text
            found = http.post("/search", json={"collection": COLLECTION, "query": "when did Milvus come up?", "top_k": 1})
            assert found.status_code == 200 and found.json()["hits"][0]["id"] == "late"
