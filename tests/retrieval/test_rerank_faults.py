"""A remote reranker that misbehaves, through the real service over HTTP: it trickles its answer, sends too
much, scores NaN, or echoes the key in a 401. Every case ends the same way: a clear 502/503/504 naming the
reranker within its deadline (never the key, anywhere), nothing wrong cached, and the breaker open when
the upstream itself failed."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest

from ragcache.settings import Settings
from tests.errors import error_of
from tests.live_server import LiveServer
from tests.models.remote.loopback import LoopbackServer, Received, Reply

SECRET = "sk-rerank-test-0123456789abcdef"
MODEL = "remote-reranker"
DEADLINE_S = 1.0
MAX_ANSWER_BYTES = 64 * 1024
TEXTS = ["first text", "second text", "third text"]


class Plan:
    """Answers TEI's /rerank with a score per text (the first text best), unless a fault is queued."""

    def __init__(self):
        self.faults: list[Reply] = []

    def __call__(self, request: Received) -> Reply:
        if self.faults:
            return self.faults.pop(0)
        return Reply(200, [{"index": i, "score": 1 / (i + 1)} for i in range(len(request.body["texts"]))])


@pytest.fixture(scope="module")
def upstream():
    plan = Plan()
    with LoopbackServer(plan) as server:
        server.plan = plan
        yield server


def settings_for(upstream, tmp_path, **overrides) -> Settings:
    options = dict(redis_url="off", milvus_uri="off", data_dir=tmp_path, rerank_url=f"{upstream.url}/rerank",
                   rerank_remote_model=MODEL, rerank_api_key=SECRET, rerank_timeout_s=DEADLINE_S,
                   rerank_max_answer_bytes=MAX_ANSWER_BYTES, request_timeout_s=8.0)
    return Settings(**{**options, **overrides})


@pytest.fixture(scope="module")
def service(upstream, tmp_path_factory):
    with LiveServer(settings_for(upstream, tmp_path_factory.mktemp("data"))) as server:
        yield server


@pytest.fixture(autouse=True)
def closed_breaker(upstream, service):
    """Each test starts with a well-behaved upstream and the reranker's breaker closed."""
    upstream.plan.faults = []
    deadline = time.monotonic() + 10
    while rerank(service, [f"breaker probe {time.monotonic()}"]).status_code != 200:
        assert time.monotonic() < deadline, "the breaker did not close"
        time.sleep(0.2)
    upstream.received.clear()


def rerank(service, texts: list[str], query: str = "which text?") -> httpx.Response:
    return httpx.post(f"{service.url}/rerank", json={"query": query, "texts": texts}, timeout=30)


def remote_stats(service) -> dict:
    return httpx.get(f"{service.url}/stats", timeout=10).json()["rerankers"][MODEL]["remote"]


def test_a_reranker_trickling_its_answer_fails_at_its_deadline_and_opens_the_breaker(service, upstream, caplog):
    good = json.dumps([{"index": i, "score": 0.5} for i in range(len(TEXTS))]).encode()
    upstream.plan.faults = [Reply(200, good + b" " * 400, drip_s=0.05)]  # ~25 s to send, no read ever slow
    started = time.monotonic()
    response = rerank(service, TEXTS, query="dripping")
    elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert error_of(response)["type"] == "upstream_timeout" and repr(MODEL) in error_of(response)["message"]
    assert elapsed < DEADLINE_S + 1.5  # its own deadline, not the request's (8 s) nor the upstream's pace
    assert remote_stats(service)["up"] is False
    # Later calls are refused at once by the open breaker, without reaching the upstream.
    num_received = len(upstream.received)
    started = time.monotonic()
    refused = rerank(service, TEXTS, query="while open")
    assert refused.status_code == 503 and "skipped" in error_of(refused)["message"]
    assert time.monotonic() - started < 0.5 and len(upstream.received) == num_received
    # Expected failures, each logged in one line: no traceback for a timeout or an open breaker.
    failures = [record for record in caplog.records if "POST /rerank failed" in record.getMessage()]
    assert len(failures) == 2 and not any(record.exc_info for record in caplog.records)


def test_an_oversized_rerank_answer_is_refused_at_the_cap(service, upstream):
    good = json.dumps([{"index": i, "score": 0.5} for i in range(len(TEXTS))]).encode()
    upstream.plan.faults = [Reply(200, good + b" " * (8 << 20))]  # valid JSON, padded to 8 MiB
    response = rerank(service, TEXTS, query="oversized")
    assert response.status_code == 502, response.text
    assert f"over {MAX_ANSWER_BYTES} bytes" in error_of(response)["message"]
    assert remote_stats(service)["up"] is False


@pytest.mark.parametrize(
    "scores",
    [b'[{"index": 0, "score": NaN}, {"index": 1, "score": 0.5}]', b'[{"index": 0, "score": "nan"}, {"index": 1, "score": 0.5}]',
     b'[{"index": 0, "score": 1e39}, {"index": 1, "score": 0.5}]', b'[{"index": 0, "score": "-Infinity"}, {"index": 1, "score": 0.5}]'],
    ids=["nan-literal", "nan-string", "float32-overflow", "infinity-string"],
)
def test_non_finite_scores_are_refused_and_never_cached(service, upstream, scores):
    texts = [f"non-finite {scores[:40]!r} a", f"non-finite {scores[:40]!r} b"]
    upstream.plan.faults = [Reply(200, scores)]
    response = rerank(service, texts, query="non-finite")
    assert response.status_code == 502, response.text
    assert error_of(response)["type"] == "upstream_bad_response"
    upstream.received.clear()
    deadline = time.monotonic() + 10
    while (again := rerank(service, texts, query="non-finite")).status_code != 200:  # the breaker's back-off
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert [item["score"] for item in again.json()] == [1.0, 0.5]  # scored anew: nothing of the bad answer kept
    assert len(upstream.received) == 1


def test_a_401_echoing_the_key_never_shows_it(upstream, tmp_path, caplog, capfd):
    caplog.set_level(logging.INFO)
    echo = {"error": {"message": f"Incorrect API key provided: {SECRET}"}}
    settings = settings_for(upstream, tmp_path, milvus_uri="", tracing="console")
    with LiveServer(settings) as server:
        documents = [{"id": f"d{i}", "text": text} for i, text in enumerate(TEXTS)]
        ingested = httpx.post(f"{server.url}/documents", json={"collection": "leak", "documents": documents}, timeout=60)
        assert ingested.status_code == 200, ingested.text
        upstream.plan.faults = [Reply(401, echo)]
        response = rerank(server, TEXTS, query="leaky")
        assert response.status_code == 502 and "refused the credentials" in error_of(response)["message"]
        stats = remote_stats(server)
        assert stats["up"] is False and "401" in stats["last_error"]
        time.sleep(1.2)  # the breaker's back-off: the search's rerank stage probes the upstream again
        upstream.plan.faults = [Reply(401, echo)]
        search = httpx.post(f"{server.url}/search", json={"query": "leaky", "collection": "leak", "top_k": 3,
                                                           "rerank": {"model": MODEL}}, timeout=60)
        assert search.status_code == 200 and "401" in search.json()["rerank_fallback"]
        shown = [response.text, json.dumps(stats), search.text, httpx.get(f"{server.url}/stats", timeout=10).text]
    traced = capfd.readouterr()
    assert '"name":' in traced.out  # the console exporter printed the spans (at shutdown)
    for text in [*shown, caplog.text, traced.out, traced.err]:
        assert SECRET not in text and "Incorrect API key" not in text
