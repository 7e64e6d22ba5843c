"""SIGTERM while the service ingests documents and embeds new texts: nothing acknowledged is lost.

The service is a real ``ragcache serve`` process over a Milvus Lite server and a Redis server that outlive
it. Clients ingest documents and embed never-seen texts (every one computed, then written behind to L2 and
L3) until the process exits on SIGTERM. Afterwards, every document that got a 2xx is in the knowledge base,
and every text that got a 2xx has its vector in L2 and in L3 — the write-behind queue was flushed before
exit. A restarted service then serves all those texts without computing any.
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import redis
from pymilvus import MilvusClient

from ragcache.core.keys import text_hashes
from ragcache.retrieval.documents import milvus_collection_name
from ragcache.storage.embedded_milvus import MilvusLiteServer
from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache_testing.service import ServiceProcess

COLLECTION = "sigterm"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class Clients:
    """Threads sending, back to back, ingests (4 new documents) and embeds (16 new texts) until stopped;
    they remember what was acknowledged with a 2xx, and count everything else."""

    def __init__(self, url: str, *, num_ingesters: int = 2, num_embedders: int = 3):
        self.url = url
        self.acknowledged_ids: list[str] = []
        self.acknowledged_texts: list[str] = []
        self.num_sent = 0
        self.num_not_acknowledged = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        workers = [(self._ingest, i) for i in range(num_ingesters)] + [(self._embed, i) for i in range(num_embedders)]
        self._threads = [threading.Thread(target=target, args=(i,), daemon=True) for target, i in workers]

    def _send(self, client: httpx.Client, path: str, body: dict) -> bool:
        try:
            ok = client.post(path, json=body).is_success
        except httpx.TransportError:  # refused or cut off by the shutdown: not acknowledged
            ok = False
        with self._lock:
            self.num_sent += 1
            self.num_not_acknowledged += not ok
        if not ok:
            time.sleep(0.05)
        return ok

    def _ingest(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            number = 0
            while not self._stop.is_set():
                ids = [f"w{worker}-{number + i}" for i in range(4)]
                number += 4
                documents = [{"id": doc_id, "text": f"document {doc_id}: a cache in front of a model"} for doc_id in ids]
                if self._send(client, "/documents", {"collection": COLLECTION, "documents": documents}):
                    with self._lock:
                        self.acknowledged_ids.extend(ids)

    def _embed(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            number = 0
            while not self._stop.is_set():
                texts = [f"a text never embedded before, worker {worker} number {number + i}" for i in range(16)]
                number += 16
                if self._send(client, "/embed", {"inputs": texts}):
                    with self._lock:
                        self.acknowledged_texts.extend(texts)

    def __enter__(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def wait_until(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def in_milvus(url: str, collection: str, field: str, values: list[str]) -> set[str]:
    client = MilvusClient(url)
    try:
        found: set[str] = set()
        for start in range(0, len(values), 200):
            batch = values[start : start + 200]
            expression = f"{field} in [{', '.join(repr(v).replace(chr(39), chr(34)) for v in batch)}]"
            found.update(row[field] for row in client.query(collection, filter=expression, output_fields=[field]))
        return found
    finally:
        client.close()


def test_sigterm_during_ingest_and_embedding_loses_nothing_acknowledged(tmp_path):
    milvus = MilvusLiteServer(tmp_path / "milvus" / "kb.db")
    redis_server = EmbeddedRedis(tmp_path / "redis")
    env = {"RAGCACHE_MILVUS_URI": milvus.url}
    try:
        # Log level info: uvicorn then logs "Application shutdown complete" once the lifespan's close returned.
        service = ServiceProcess(tmp_path, redis_url=redis_server.url, extra_env=env, log_level="info")
        try:
            space_id = service.client.get("/info").json()["models"][0]["space"]["space_id"]
            with Clients(service.url) as clients:
                wait_until(lambda: len(clients.acknowledged_ids) >= 40 and len(clients.acknowledged_texts) >= 160)
                service.process.terminate()
                signalled_at = time.monotonic()
                return_code = service.process.wait(timeout=120)
                exit_s = time.monotonic() - signalled_at
        finally:
            service.stop()
        log = service.log_path.read_text(errors="replace")
        ids, texts = list(clients.acknowledged_ids), list(clients.acknowledged_texts)

        milvus.restart()  # what was stored survives Milvus' own restart too
        found_ids = in_milvus(milvus.url, milvus_collection_name(COLLECTION), "id", ids)
        hashes = text_hashes(texts)
        found_l3 = in_milvus(milvus.url, f"rc_{space_id}", "key", hashes)
        with redis.Redis.from_url(redis_server.url) as client:
            in_l2 = sum(value is not None for value in client.mget([f"rc:{space_id}:{h}" for h in hashes]))

        restarted = ServiceProcess(tmp_path, redis_url=redis_server.url, extra_env={**env, "RAGCACHE_REDIS_URL": "off"})
        try:
            count = restarted.client.get("/collections").json()["collections"][0]["num_documents"]
            response = restarted.post("/embed", {"inputs": texts})  # no Redis now: only L3 can serve them
        finally:
            restarted.stop()
    finally:
        redis_server.stop()
        milvus.stop()

    print(f"\nFAULT sigterm: exit code {return_code} {exit_s:.1f} s after SIGTERM; {clients.num_sent} requests, "
          f"{clients.num_not_acknowledged} not acknowledged (cut off by the shutdown); {len(ids)} documents acknowledged, "
          f"{len(found_ids)} in Milvus after restart, collection holds {count}; {len(texts)} texts embedded, "
          f"{len(found_l3)} in L3, {in_l2} in L2; restarted service: {response.headers['x-cache-l3']} from L3, "
          f"{response.headers['x-cache-compute']} computed")
    # uvicorn re-raises the signal after its graceful shutdown, so the process ends "killed by SIGTERM";
    # the log shows that the shutdown (the lifespan's close: flush, then close the stores) ran to the end.
    assert return_code in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in log and "Traceback" not in log
    assert found_ids == set(ids) and count >= len(ids)
    assert found_l3 == set(hashes) and in_l2 == len(hashes)
    assert response.headers["x-cache-compute"] == "0" and response.headers["x-cache-l3"] == str(len(texts))
