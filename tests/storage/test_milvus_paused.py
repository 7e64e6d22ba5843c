"""A hung Milvus: a real Milvus Lite server paused with SIGSTOP, not stopped.

A stopped server refuses connections at once; a paused one accepts them and never answers, which is what
a hung or overloaded Milvus does. Before every Milvus call had a deadline, embedding a new text waited on
it without end (L3 "up", the model never called, the breaker never opened). Here, while it is paused,
embeds come from the model with L3 counted as down, the knowledge base answers 503 naming Milvus (and
never the credentials in its URI), and everything works again once the server is resumed (SIGCONT).

The server is resumed in a ``finally`` and stopped (resumed first) when the module ends, whatever fails.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx
import pytest

from ragcache.build import build_cache
from ragcache.errors import NotFoundError, TierUnavailableError
from ragcache.retrieval.knowledge import KnowledgeBase
from ragcache.settings import Settings
from ragcache.storage.embedded_milvus import MilvusLiteServer
from ragcache.storage.stores import Stores, open_milvus
from tests.live_server import LiveServer

TIMEOUT_S = 1.0  # milvus_timeout_s in these tests: short, so a paused server costs each call one second
SECRET = "s3cretMilvusPW"
ADMIN_KEY = "admin-key-0123456789"
TENANT_KEY = "tenant-key-0123456789"
DOCS = [{"id": f"doc-{i}", "text": f"paragraph {i} about caches and what a paused store does"} for i in range(5)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    milvus = MilvusLiteServer(tmp_path_factory.mktemp("paused") / "milvus.db")
    try:
        yield milvus
    finally:
        milvus.stop()  # resumes it first: a paused process would not act on SIGTERM


@contextlib.contextmanager
def paused(milvus: MilvusLiteServer):
    milvus.pause()
    try:
        yield
    finally:
        milvus.resume()


def until(condition, what: str, timeout_s: float = 60.0):
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.2)
    pytest.fail(f"{what} did not happen within {timeout_s} s")


def test_a_paused_milvus_is_an_outage_for_l3_and_the_knowledge_base_until_resumed(server, encoder):
    client = open_milvus(server.url, timeout_s=TIMEOUT_S)
    settings = Settings(redis_url="off", milvus_uri=server.url, write_behind=False)
    cache = build_cache(settings, Stores(None, client), encoder)
    kb = KnowledgeBase(client)
    kb.add_documents("paused_lib", DOCS, cache=cache)
    try:
        with paused(server):
            result = cache.embed_detailed(["a text no level has seen before the pause"])
            assert result.vectors.shape == (1, encoder.space.dim)
            assert result.level_names[int(result.levels[0])] == result.level_names[-1]  # from the model
            l3 = cache.level_states()["L3"]
            assert not l3["up"] and "deadline" in l3["last_error"]

            with pytest.raises(TierUnavailableError, match="Milvus failed .*deadline"):
                kb.search("paused_lib", "what does a paused store do?", cache=cache)
            # The breaker is open: the next request is answered at once, without asking Milvus (the same query:
            # its vector is in L1 now, so no probe of the paused L3 delays it past the breaker's back-off).
            with pytest.raises(TierUnavailableError, match="Milvus is down"):
                kb.search("paused_lib", "what does a paused store do?", cache=cache)
            assert kb.health.is_down

        until(lambda: _searches(kb, cache), "a search after SIGCONT")
        # A new text each time: one found in L1 never reaches L3, and only a lookup that does can find it back up.
        until(lambda: cache.embed([f"after the pause {time.monotonic()}"]) is not None and cache.level_states()["L3"]["up"],
              "L3 back up")
        assert not kb.health.is_down
    finally:
        cache.close()
        client.close()


def _searches(kb: KnowledgeBase, cache) -> bool:
    try:
        return bool(kb.search("paused_lib", "what does a paused store do?", cache=cache).hits)
    except TierUnavailableError:
        return False


def test_the_service_answers_while_milvus_is_paused_and_never_shows_its_credentials(server, tmp_path):
    keys = {"keys": [
        {"name": "operator", "key": ADMIN_KEY, "scopes": "*"},
        {"name": "tenant", "key": TENANT_KEY, "scopes": ["embed", "search", "ingest"]},
    ]}
    uri = server.url.replace("http://", f"http://root:{SECRET}@")
    settings = Settings(redis_url="off", milvus_uri=uri, milvus_timeout_s=TIMEOUT_S, data_dir=tmp_path / "data",
                        api_keys=json.dumps(keys), request_timeout_s=30)
    with LiveServer(settings) as live, \
            httpx.Client(base_url=live.url, timeout=60, headers={"Authorization": f"Bearer {TENANT_KEY}"}) as tenant, \
            httpx.Client(base_url=live.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        assert tenant.post("/documents", json={"collection": "paused_svc", "documents": DOCS}).status_code == 200
        seen = []
        with paused(server):
            embedded = tenant.post("/embed", json={"inputs": ["new while Milvus is paused", "and another one"]})
            assert embedded.status_code == 200 and len(embedded.json()) == 2  # from the model, not a 504
            assert "L3" in admin.get("/health").json()["levels_down"]
            searched = tenant.post("/search", json={"collection": "paused_svc", "query": "a paused store?"})
            assert searched.status_code == 503, searched.text
            error = searched.json()["error"]
            assert error["type"] == "unavailable" and "Milvus" in error["message"]
            again = tenant.post("/search", json={"collection": "paused_svc", "query": "a paused store?"})
            assert again.status_code == 503 and "Milvus is down" in again.json()["error"]["message"]
            seen += [searched.text, again.text, admin.get("/stats").text, admin.get("/info").text]
            tenant_info = tenant.get("/info").json()
            seen.append(json.dumps(tenant_info))

        until(lambda: tenant.post("/search", json={"collection": "paused_svc", "query": "back?"}).status_code == 200,
              "a search answered after SIGCONT")
        until(lambda: tenant.post("/embed", json={"inputs": [f"after {time.monotonic()}"]}).status_code == 200
              and admin.get("/health").json()["levels_down"] == [], "L3 back up")
        admin_info = admin.get("/info").json()

    assert all(SECRET not in text for text in seen)
    assert admin_info["settings"]["milvus"] == server.url.replace("http://", "http://***@")
    assert set(tenant_info) == {"default_model", "models"}
    # Non-admin keys see what a client needs to call a model (name, dimensions, dtype, prompt names), no state.
    assert tenant_info["models"] == [
        {"name": m["name"], "dim": m["dim"], "dtype": m["dtype"], "prompts": m["prompts"]} for m in admin_info["models"]
    ]
    assert "levels" in admin_info["models"][0]


def test_waiting_for_a_paused_milvus_does_not_hold_other_collections(server, encoder):
    """Two threads preparing one L3 collection while Milvus hangs: the second does not wait out a second deadline
    behind the first, and the knowledge base holds no lock shared by every collection while it asks Milvus."""
    client = open_milvus(server.url, timeout_s=TIMEOUT_S)
    kb = KnowledgeBase(client)
    outcomes: list[str] = []

    def look_up(name: str) -> None:
        try:
            kb.collection_info(name)
            outcomes.append("answered")
        except (TierUnavailableError, NotFoundError) as exc:
            # NotFoundError: a call that Milvus answered in the instant before the pause took hold (seen on a
            # loaded machine); the point here is that no thread waits behind another, not which answered.
            outcomes.append(str(exc))

    try:
        with paused(server):
            threads = [threading.Thread(target=look_up, args=(f"hung_{i}",)) for i in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=4 * TIMEOUT_S + 30)
            assert not any(thread.is_alive() for thread in threads)
    finally:
        client.close()
    assert len(outcomes) == 4 and all("Milvus" in outcome or "does not exist" in outcome for outcome in outcomes)
    assert any("deadline" in outcome for outcome in outcomes)
