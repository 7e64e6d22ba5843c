"""Limits: token buckets (pure logic, an injected clock), then body size, text size, id counts and the
request deadline against the real service."""

import asyncio
import json
import uuid

import httpx
import pytest

from ragcache.settings import Settings
from ragcache_server.auth import AccessMiddleware, KeyRing
from ragcache_server.limits import LimitsMiddleware, RateLimiter
from tests.errors import error_of
from tests.live_server import LiveServer

MAX_BODY = 256 * 1024
MAX_TEXT = 1024
MAX_BATCH = 256
DEADLINE_S = 0.1


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_token_bucket_allows_the_burst_then_the_rate():
    clock = Clock()
    limiter = RateLimiter(2.0, 3, clock=clock)
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("k") == pytest.approx(0.5)  # one token every 0.5 s
    clock.now += 0.5
    assert limiter.take("k") == 0.0 and limiter.take("k") == pytest.approx(0.5)
    clock.now += 100  # saved tokens stop at the burst
    assert [limiter.take("k") == 0.0 for _ in range(4)] == [True, True, True, False]
    assert limiter.take("other") == 0.0  # one bucket per caller


def test_a_keys_own_rate_overrides_the_default_and_none_means_unlimited():
    clock = Clock()
    assert all(RateLimiter(None, None, clock=clock).take("k") == 0.0 for _ in range(1000))
    limiter = RateLimiter(None, None, clock=clock)
    assert [limiter.take("k", 0.5, 1) for _ in range(2)] == [0.0, 2.0]
    limiter = RateLimiter(10.0, None, clock=clock)  # default burst: twice the rate
    assert sum(limiter.take("k") == 0.0 for _ in range(50)) == 20


def test_the_deadline_answers_504_and_a_started_answer_is_left_alone():
    async def slow_app(scope, receive, send):
        await asyncio.sleep(30)

    async def streaming_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(30)

    def call(app):
        return asgi_messages(LimitsMiddleware(app, max_body_bytes=10, timeout_s=0.05), {})

    answered = call(slow_app)
    assert answered[0]["status"] == 504 and b"RAGCACHE_REQUEST_TIMEOUT_S" in answered[1]["body"]
    assert [message.get("status") for message in call(streaming_app)] == [200]


def test_an_open_service_limits_each_client_address():
    async def ok_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    middleware = AccessMiddleware(ok_app, keys=KeyRing([]), limiter=RateLimiter(0.01, 1, clock=Clock()), routes=[])

    def status_for(address):
        first = asgi_messages(middleware, {"client": (address, 5000)})[0]
        return first["status"], dict(first["headers"]).get(b"retry-after")

    assert status_for("10.0.0.1") == (200, None)
    assert status_for("10.0.0.1") == (429, b"100")
    assert status_for("10.0.0.2") == (200, None)


def asgi_messages(app, scope: dict) -> list[dict]:
    """What ``app`` sends for an empty POST /embed (``scope`` adds to or overrides the defaults)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "path": "/embed", "method": "POST", "headers": [], **scope}, receive, send))
    return sent


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    settings = Settings(
        redis_url=redis_server,
        data_dir=tmp_path_factory.mktemp("limits"),
        max_body_bytes=MAX_BODY,
        max_text_bytes=MAX_TEXT,
        max_batch=MAX_BATCH,
        rate_limit_per_s=1000.0,
    )
    with LiveServer(settings) as live:
        yield live



def assert_error(response, status, field=None, words=""):
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["field"] == field and words in error["message"]


def test_a_body_over_the_limit_is_refused_by_its_content_length(http):
    body = json.dumps({"inputs": ["x" * 1000] * 400}).encode()
    assert_error(http.post("/embed", content=body, headers={"content-type": "application/json"}), 413, "body", "RAGCACHE_MAX_BODY_BYTES")


def test_a_streamed_body_is_cut_off_at_the_limit(http):
    sent = []

    def chunks():
        yield b'{"inputs": ["'
        for _ in range(1000):  # 1 MB in all, without a Content-Length
            sent.append(1)
            yield b"y" * 1024

    response = http.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert_error(response, 413, "body", "more than")


def test_a_text_over_the_byte_limit_is_a_413_naming_it(http):
    assert_error(http.post("/embed", json={"inputs": ["ok", "é" * MAX_TEXT]}), 413, "inputs[1]", "RAGCACHE_MAX_TEXT_BYTES")
    assert_error(http.post("/v1/embeddings", json={"input": "z" * (MAX_TEXT + 1)}), 400, "input")  # OpenAI's 400
    assert http.post("/embed", json={"inputs": ["z" * MAX_TEXT]}).status_code == 200  # at the limit is fine
    assert http.post("/search", json={"collection": "c", "query": "q" * MAX_TEXT}).status_code == 404  # went on, to the lookup
    assert_error(http.post("/search", json={"collection": "c", "query": "q" * (MAX_TEXT + 1)}), 413, "query")


def test_id_and_document_counts_are_capped(http):
    assert_error(http.request("DELETE", "/documents", json={"collection": "c", "ids": ["a"] * (MAX_BATCH + 1)}), 413, "ids")
    documents = [{"id": str(i), "text": "t"} for i in range(MAX_BATCH + 1)]
    assert_error(http.post("/documents", json={"collection": "c", "documents": documents}), 413, "documents")


def test_a_request_past_the_deadline_is_a_504_and_the_service_goes_on(redis_server, tmp_path):
    settings = Settings(redis_url=redis_server, data_dir=tmp_path, milvus_uri="off", request_timeout_s=DEADLINE_S)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=120) as http:
        # Fresh texts keep the CPU model busy for a second or more, many times the deadline.
        tag = uuid.uuid4().hex
        texts = [f"{tag} {i} " + "some words to embed " * 12 for i in range(MAX_BATCH)]
        response = http.post("/embed", json={"inputs": texts})
        assert_error(response, 504, None, "RAGCACHE_REQUEST_TIMEOUT_S")
        assert http.get("/health").status_code == 200  # health has no deadline, and the loop is free
