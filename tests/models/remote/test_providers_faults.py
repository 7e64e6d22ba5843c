"""A remote model that misbehaves, through the real service over HTTP, with a real Redis as L2.

The upstream is a fault-injecting server of our own on loopback (``loopback.py``), used only for faults: it
answers OpenAI's ``/embeddings`` with known vectors (a function of the text), or with whatever a test asks
for. Every case ends the same way: the client gets the right vectors or a clear 502/503/504 naming the
model (never the key), nothing wrong is in L1 or L2, and the service still answers.
"""

from __future__ import annotations

import base64
import json
import threading
import time

import httpx
import numpy as np
import pytest
import xxhash

from ragcache.settings import Settings
from ragcache.storage.processes import free_port
from ragcache_cli.cli import main
from tests.errors import error_of
from tests.live_server import LiveServer
from tests.models.remote.loopback import LoopbackServer, Received, Reply

DIM = 8
SECRET = "sk-fault-test-0123456789abcdef"
MODEL = "faulty"
DOWN = "down"
BYOK = "byok"
BYOK_OWN = "byok-own"
QUOTA_LESS = "Bearer quota-less-key"
FAILING_FOR_KEY = "Bearer key-the-upstream-fails-for"
HANGING_FOR_KEY = "Bearer key-the-upstream-hangs-for"
QUERY_PROMPT = "query: "


def known_vector(text: str) -> np.ndarray:
    """The vector the upstream computes for ``text``: any fixed function of it will do."""
    rng = np.random.default_rng(xxhash.xxh64_intdigest(text.encode()))
    return rng.standard_normal(DIM).astype(np.float32)


def good_answer(texts: list[str], *, base64_rows: bool = True) -> dict:
    rows = [known_vector(t) for t in texts]
    data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(r.astype("<f4").tobytes()).decode() if base64_rows
             else [float(x) for x in r]} for i, r in enumerate(rows)]
    return {"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 3 * len(texts), "total_tokens": 3 * len(texts)}}


class Upstream:
    """The fault plan: ``faults`` is a list of replies to give, one per request, before answering well."""

    def __init__(self):
        self.faults: list = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, request: Received) -> Reply:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return self._answer(request)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _answer(self, request: Received) -> Reply:
        texts = request.body["input"]
        if any("SLOW" in t for t in texts):
            threading.Event().wait(0.5)  # long enough for the other requests of the batch to be in flight too
        if request.headers.get("authorization") == "Bearer refused-key":
            return Reply(401, {"error": {"message": "Incorrect API key provided: refused-key"}})
        if request.headers.get("authorization") == FAILING_FOR_KEY:  # an upstream that fails only for this key
            return Reply(500, {"error": "internal error for this key"})
        if request.headers.get("authorization") == HANGING_FOR_KEY:
            threading.Event().wait(2.0)  # past the model's timeout_s of 1.5
            return Reply(200, good_answer(texts))
        if request.headers.get("authorization") == QUOTA_LESS:  # what OpenAI answers a key without credit
            quota = {"error": {"message": "You exceeded your current quota (quota-less-key)", "code": "insufficient_quota"}}
            return Reply(429, quota)
        if any("FAIL500" in t for t in texts):
            return Reply(500, {"error": "boom"})
        if any("TOOLONG" in t for t in texts):
            return Reply(400, {"error": {"message": "input too long"}})
        if self.faults:
            fault = self.faults.pop(0)
            return fault(texts) if callable(fault) else fault
        return Reply(200, good_answer(texts))


@pytest.fixture(scope="module")
def upstream():
    plan = Upstream()
    with LoopbackServer(plan) as server:
        server.plan = plan
        yield server


@pytest.fixture(scope="module")
def service(upstream, redis_server, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("FAULT_TEST_KEY", SECRET)
    model = {"name": MODEL, "provider": "openai", "base_url": upstream.url, "upstream_model": "m", "dimensions": DIM,
             "api_key_env": "FAULT_TEST_KEY", "max_inputs": 2, "timeout_s": 1.5, "max_retries": 2, "retry_backoff_s": 0.05}
    # Another model whose upstream is not there at all (a port nothing listens on).
    down = {**model, "name": DOWN, "base_url": f"http://127.0.0.1:{free_port()}"}
    # Each caller pays with its own key (no key of the model's own): the service has no API keys, so
    # the callers' Authorization header is theirs for the upstream.
    byok = {**model, "name": BYOK, "pass_through_auth": True, "api_key_env": None}
    # Callers may pay with their own key; those who send none are served with the model's own.
    byok_own = {**model, "name": BYOK_OWN, "pass_through_auth": True}
    models_json = json.dumps({"models": [model, down, byok, byok_own]})
    prompts = {BYOK: {"query": QUERY_PROMPT}, BYOK_OWN: {"query": QUERY_PROMPT}}
    settings = Settings(model=MODEL, models_json=models_json, model_prompts=prompts, redis_url=redis_server, milvus_uri="off",
                        data_dir=tmp_path_factory.mktemp("data"), write_behind=False, single_flight=False)
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(autouse=True)
def healthy_upstream(upstream, service):
    """Each test starts with a well-behaved upstream and a closed breaker."""
    upstream.plan.faults = []
    deadline = time.monotonic() + 10
    while post(service, [f"breaker probe {time.monotonic()}"]).status_code != 200:
        assert time.monotonic() < deadline, "the breaker did not close"
        time.sleep(0.1)
    upstream.received.clear()
    yield


def post(service, texts: list[str], model: str = MODEL, headers: dict | None = None) -> httpx.Response:
    body = {"model": model, "input": texts, "encoding_format": "base64"}
    return httpx.post(f"{service.url}/v1/embeddings", json=body, headers=headers, timeout=30)


def vectors_of(response: httpx.Response) -> np.ndarray:
    return np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in response.json()["data"]])


def cached_levels(service, texts: list[str], model: str = MODEL) -> dict[str, int]:
    """How many of ``texts`` L1 and L2 hold."""
    cache = service.state.cache_for(model)
    keys = cache.space.keys(texts)
    return {tier.name: len(tier.get_many(keys).index) for tier in cache.tiers}


def assert_refused(service, texts: list[str], status: int, error_type: str, model: str = MODEL) -> dict:
    response = post(service, texts, model)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["type"] == error_type and repr(model) in error["message"]
    assert SECRET not in response.text
    assert cached_levels(service, texts, model) == {"L1": 0, "L2": 0}
    assert httpx.get(f"{service.url}/health", timeout=5).status_code == 200
    return error


def test_a_good_answer_is_served_and_cached_and_the_key_sent(service, upstream):
    texts = ["good one", "good two", "good three"]
    response = post(service, texts)
    assert response.status_code == 200
    assert np.array_equal(vectors_of(response), np.stack([known_vector(t) for t in texts]))
    assert cached_levels(service, texts) == {"L1": 3, "L2": 3}
    assert len(upstream.received) == 2  # max_inputs=2: two upstream requests
    assert {r.headers["authorization"] for r in upstream.received} == {f"Bearer {SECRET}"}


def test_429_with_retry_after_is_waited_for_then_served(service, upstream):
    upstream.plan.faults = [Reply(429, {"error": "slow down"}, headers={"Retry-After": "0.3"})]
    texts = ["rate limited once"]
    response = post(service, texts)
    assert response.status_code == 200
    assert np.array_equal(vectors_of(response), known_vector(texts[0])[None])
    assert len(upstream.received) == 2
    assert service.state.cache_for(MODEL).encoder.stats().num_retries >= 1


def test_429_asking_for_longer_than_the_timeout_fails_at_once_with_503(service, upstream):
    upstream.plan.faults = [Reply(429, {"error": "slow down"}, headers={"Retry-After": "120"})]
    error = assert_refused(service, ["rate limited long"], 503, "upstream_unavailable")
    assert "rate limited" in error["message"] and len(upstream.received) == 1


def test_an_answer_cut_off_mid_body_is_tried_again(service, upstream):
    # The connection closes after 40 bytes of a longer announced body: a dropped connection, retried.
    upstream.plan.faults = [lambda texts: Reply(200, json.dumps(good_answer(texts)).encode(), cut=40)]
    response = post(service, ["cut off once"])
    assert response.status_code == 200 and len(upstream.received) == 2
    assert np.array_equal(vectors_of(response), known_vector("cut off once")[None])


def test_500_is_retried_then_served(service, upstream):
    upstream.plan.faults = [Reply(500, {"error": "boom"})]
    response = post(service, ["five hundred once"])
    assert response.status_code == 200 and len(upstream.received) == 2


def test_500_past_the_retries_is_a_502(service, upstream):
    assert_refused(service, ["always FAIL500"], 502, "upstream_bad_response")
    assert len(upstream.received) == 3  # the first try and max_retries=2


def test_an_upstream_that_hangs_past_the_timeout_is_a_504(service, upstream):
    upstream.plan.faults = [Reply(200, {}, hang_s=5)] * 3
    error = assert_refused(service, ["hanging"], 504, "upstream_timeout")
    assert "within 1.5 s" in error["message"]  # cut off at timeout_s, not when the upstream gave up (5 s)


@pytest.mark.parametrize(
    "fault, words",
    [
        (lambda texts: Reply(200, json.dumps(good_answer(texts)).encode()[:40]), "not usable"),  # truncated JSON
        (lambda texts: Reply(200, b"<html>gateway</html>"), "not usable"),
        (lambda texts: Reply(200, {**good_answer(texts), "data": good_answer(texts)["data"][:-1]}), "vectors for"),  # fewer
        (lambda texts: Reply(200, {"data": [{**d, "embedding": d["embedding"][:-8]} for d in good_answer(texts)["data"]]}),
         "not float32 vectors|dimensions"),  # wrong dimension (base64 one float short)
        (lambda texts: Reply(200, {"data": [{"index": i, "embedding": [0.5] * (DIM + 1)} for i in range(len(texts))]}),
         "dimensions"),  # wrong dimension, JSON numbers
        (lambda texts: Reply(200, {"data": [{"index": i, "embedding": base64.b64encode(np.full(DIM, np.nan, "<f4").tobytes()).decode()}
                                            for i in range(len(texts))]}), "NaN"),
        (lambda texts: Reply(200, {"data": [{"index": i, "embedding": [1e39] * DIM} for i in range(len(texts))]}), "NaN or infinite"),
        (lambda texts: Reply(200, {"data": list(reversed(good_answer(texts)["data"]))}), "in order"),  # out of order
        (lambda texts: Reply(200, {"data": [{**d, "index": 0} for d in good_answer(texts)["data"]]}), "in order"),  # duplicate index
    ],
    ids=["truncated", "not-json", "fewer", "short-base64", "wrong-dim", "nan", "overflow", "out-of-order", "duplicate-index"],
)
def test_an_answer_that_cannot_be_trusted_is_a_502_and_never_cached(service, upstream, fault, words):
    texts = [f"untrusted {words} a", f"untrusted {words} b"]
    upstream.plan.faults = [fault]
    error = assert_refused(service, texts, 502, "upstream_bad_response")
    assert any(word in error["message"] for word in words.split("|")), error["message"]
    assert len(upstream.received) == 1  # a garbled answer is not asked for again


def test_refused_credentials_are_a_502_that_never_quotes_the_key(service, upstream):
    upstream.plan.faults = [Reply(401, {"error": {"message": f"Incorrect API key provided: {SECRET}"}})]
    error = assert_refused(service, ["wrong key"], 502, "upstream_bad_response")
    assert "credentials" in error["message"]


def test_an_unreachable_upstream_is_a_503_and_the_breaker_then_answers_at_once(service):
    assert_refused(service, ["nobody home"], 503, "upstream_unavailable", DOWN)
    error = assert_refused(service, ["still nobody"], 503, "upstream_unavailable", DOWN)
    assert "skipped" in error["message"]
    upstream = httpx.get(f"{service.url}/stats", timeout=5).json()["models"][DOWN]["upstream"]
    assert upstream["up"] is False and upstream["errors"]["unavailable"] >= 1 and upstream["errors"]["breaker_open"] >= 1
    metrics = httpx.get(f"{service.url}/metrics", timeout=5).text
    assert f'ragcache_upstream_up{{model="{DOWN}",provider="openai"}} 0.0' in metrics
    assert f'ragcache_upstream_up{{model="{MODEL}",provider="openai"}} 1.0' in metrics


def test_a_failed_upstream_request_fails_only_the_texts_it_carried(service, upstream):
    # max_inputs=2: ["kept a", "kept b"] go in one request, ["FAIL500 c"] in another, which fails.
    texts = ["kept a", "kept b", "FAIL500 c"]
    response = post(service, texts)
    assert response.status_code == 502
    assert cached_levels(service, texts[:2]) == {"L1": 2, "L2": 2}
    assert cached_levels(service, texts[2:]) == {"L1": 0, "L2": 0}
    upstream.received.clear()
    again = post(service, texts[:2])
    assert again.status_code == 200 and again.headers["X-Cache-L1"] == "2" and not upstream.received


def test_a_text_the_upstream_refuses_is_isolated_from_its_batch(service, upstream):
    # "fine" and "TOOLONG" share one request, which gets a 400: the batch is split, "fine" gets its vector.
    response = post(service, ["fine", "TOOLONG here"])
    assert response.status_code == 502 and "input too long" in error_of(response)["message"]
    assert cached_levels(service, ["fine"]) == {"L1": 1, "L2": 1}
    assert service.state.cache_for(MODEL).encoder.stats().up  # a refused text does not open the breaker


def test_stats_metrics_and_the_watch_show_what_the_upstream_cost_and_the_cache_saved(service, upstream, capsys):
    texts = ["counted one", "counted two"]
    assert post(service, texts).status_code == 200
    assert post(service, texts).headers["X-Cache-L1"] == "2"  # two hits: two texts not sent again
    upstream_stats = httpx.get(f"{service.url}/stats", timeout=5).json()["models"][MODEL]["upstream"]
    assert upstream_stats["provider"] == "openai" and upstream_stats["endpoint"] == f"http://127.0.0.1:{upstream.port}"
    assert upstream_stats["num_tokens"] >= 6 and upstream_stats["texts_saved"] >= 2 and upstream_stats["tokens_saved"] > 0
    assert upstream_stats["money_saved"] is None  # no price configured
    assert SECRET not in json.dumps(upstream_stats)
    metrics = httpx.get(f"{service.url}/metrics", timeout=5).text
    for name in ("requests_total", "texts_total", "tokens_total", "retries_total", "tokens_saved_total", "latency_seconds_count"):
        assert f'ragcache_upstream_{name}{{model="{MODEL}",provider="openai"}}' in metrics, name
    info = httpx.get(f"{service.url}/info", timeout=30)
    assert info.status_code == 200 and MODEL in info.text and SECRET not in info.text
    assert main(["stats", "--watch", "--count", "1", "--interval", "0.1", "--url", service.url]) == 0
    out = capsys.readouterr().out
    assert f"upstream openai http://127.0.0.1:{upstream.port}  up" in out and "tokens" in out and "saved:" in out


def test_pass_through_sends_each_callers_misses_with_that_callers_key_only(service, upstream):
    def as_caller(name: str) -> dict:
        return {"Authorization": f"Bearer key-of-{name}"}

    assert post(service, ["paid by a"], BYOK, as_caller("a")).status_code == 200
    assert [r.headers["authorization"] for r in upstream.received] == ["Bearer key-of-a"]
    upstream.received.clear()
    # b misses one text and hits the one a paid for: only b's miss goes upstream, with b's key.
    response = post(service, ["paid by a", "paid by b"], BYOK, as_caller("b"))
    assert response.status_code == 200 and response.headers["X-Cache-L1"] == "1"
    assert [(r.headers["authorization"], r.body["input"]) for r in upstream.received] == [("Bearer key-of-b", ["paid by b"])]
    upstream.received.clear()

    # Many callers at once: batched together in the cache, but never one upstream request for two keys.
    from concurrent.futures import ThreadPoolExecutor

    callers = [f"c{i}" for i in range(6)]
    with ThreadPoolExecutor(len(callers)) as pool:
        answers = list(pool.map(lambda c: post(service, [f"{c} text {j}" for j in range(3)], BYOK, as_caller(c)), callers))
    assert all(answer.status_code == 200 for answer in answers)
    for request in upstream.received:
        owners = {text.split()[0] for text in request.body["input"]}
        assert owners == {request.headers["authorization"].removeprefix("Bearer key-of-")}, request


def test_a_callers_key_pays_for_its_own_misses_under_a_named_prompt(service, upstream):
    """The model is sent a prompted text as prompt + text: the caller's key must be registered for that text, or
    the miss goes upstream with the model's own key (BYOK_OWN) or with none (BYOK)."""
    for model in (BYOK_OWN, BYOK):
        upstream.received.clear()
        text = f"prompted miss of {model}"
        body = {"model": model, "input": [text], "prompt_name": "query", "encoding_format": "base64"}
        response = httpx.post(f"{service.url}/v1/embeddings", json=body, headers={"Authorization": "Bearer key-of-q"}, timeout=30)
        assert response.status_code == 200, response.text
        assert [(r.headers["authorization"], r.body["input"]) for r in upstream.received] == [
            ("Bearer key-of-q", [QUERY_PROMPT + text])]
        assert np.array_equal(vectors_of(response)[0], known_vector(QUERY_PROMPT + text))
        # The same text without the prompt is another space's miss, paid by its own caller.
        upstream.received.clear()
        assert post(service, [text], model, {"Authorization": "Bearer key-of-r"}).status_code == 200
        assert [(r.headers["authorization"], r.body["input"]) for r in upstream.received] == [("Bearer key-of-r", [text])]


def test_a_callers_refused_key_fails_that_caller_only(service, upstream):
    response = post(service, ["refused caller text"], BYOK, {"Authorization": "Bearer refused-key"})
    assert response.status_code == 502 and "caller's own key" in error_of(response)["message"]
    assert "refused-key" not in response.text
    assert cached_levels(service, ["refused caller text"], BYOK) == {"L1": 0, "L2": 0}
    # The breaker stays closed: another caller is served at once.
    assert post(service, ["another caller"], BYOK, {"Authorization": "Bearer key-of-z"}).status_code == 200
    assert service.state.cache_for(BYOK).encoder.stats().up
    bad = post(service, ["x"], BYOK, {"Authorization": "Basic abc"})
    assert bad.status_code == 400 and error_of(bad)["field"] == "Authorization"


def test_at_most_concurrency_requests_are_in_flight_to_the_upstream(service, upstream):
    # 16 texts, 2 per request: 8 upstream requests for one batch, and concurrency 4 (the default).
    upstream.plan.max_in_flight = 0
    texts = [f"SLOW parallel {i}" for i in range(16)]
    response = post(service, texts)
    assert response.status_code == 200 and len(upstream.received) == 8
    assert np.array_equal(vectors_of(response), np.stack([known_vector(t) for t in texts]))
    assert 1 < upstream.plan.max_in_flight <= 4


def test_a_callers_rate_limited_key_fails_that_caller_only_while_the_models_own_key_serves_others(service, upstream):
    from concurrent.futures import ThreadPoolExecutor

    quota_less = {"Authorization": QUOTA_LESS}
    with ThreadPoolExecutor(3) as pool:  # three callers sending a key without credit, over and over
        attacks = [pool.submit(post, service, [f"attack {i} {j}"], BYOK_OWN, quota_less) for i in range(3) for j in range(6)]
        served = [post(service, [f"served with the model's key {k}"], BYOK_OWN) for k in range(8)]
        refused = [attack.result() for attack in attacks]
    assert [response.status_code for response in served] == [200] * len(served)
    assert {response.status_code for response in refused} == {503}
    for response in refused:
        message = error_of(response)["message"]
        assert "caller's own key" in message and "rate limited" in message and "quota-less-key" not in response.text
    # Not retried (waiting gives the key no credit) and not counted against the model: the breaker stays closed.
    assert sum(r.headers["authorization"] == QUOTA_LESS for r in upstream.received) == len(attacks)
    assert {r.headers["authorization"] for r in upstream.received} == {QUOTA_LESS, f"Bearer {SECRET}"}
    assert service.state.cache_for(BYOK_OWN).encoder.stats().up


@pytest.mark.parametrize("caller_key, status", [(FAILING_FOR_KEY, 502), (HANGING_FOR_KEY, 504)])
def test_a_callers_key_the_upstream_fails_or_hangs_for_opens_that_keys_breaker_only(service, upstream, caller_key, status,
                                                                                       monkeypatch):
    """Before: the caller's 5xx (after the retries) or timeout opened the model's breaker, and every other caller
    got 503 until a probe passed."""
    # The key's breaker is made from the model's back-off and clock: a clock that stands still keeps it open for the
    # whole test, however long the requests below take on a loaded machine (its back-off is half a second).
    frozen = time.monotonic()
    monkeypatch.setattr(service.state.cache_for(BYOK_OWN).encoder.health, "clock", lambda: frozen)
    failing = {"Authorization": caller_key}
    response = post(service, ["fails for this key 0"], BYOK_OWN, failing)
    assert response.status_code == status, response.text
    assert "caller's own key" in error_of(response)["message"] and "key-the-upstream" not in response.text
    assert service.state.cache_for(BYOK_OWN).encoder.stats().up  # the model's breaker stays closed
    served = [post(service, [f"served for others {caller_key} {k}"], BYOK_OWN) for k in range(3)]
    served.append(post(service, [f"served for another key {caller_key}"], BYOK_OWN, {"Authorization": "Bearer key-of-y"}))
    assert [answer.status_code for answer in served] == [200] * 4
    # The failing key's own breaker is open: its next miss fails at once, without a request upstream.
    sent = sum(r.headers["authorization"] == caller_key for r in upstream.received)
    again = post(service, ["fails for this key 1"], BYOK_OWN, failing)
    assert again.status_code == 503 and "skipped for it" in error_of(again)["message"]
    assert sum(r.headers["authorization"] == caller_key for r in upstream.received) == sent


@pytest.mark.parametrize("header", ["X-Upstream-Authorization", "Authorization"])
def test_a_non_ascii_byte_in_the_callers_key_header_is_a_400_naming_the_header(service, upstream, header):
    """Before: a 500 with a traceback (the outbound request could not encode the key)."""
    model = BYOK_OWN if header == "X-Upstream-Authorization" else BYOK
    for value in (b"Bearer k\xc3\xa9y-with-utf8", b"Bearer k\xffy"):  # (control bytes: the server refuses them itself)
        response = post(service, [f"non-ascii key {value!r}"], model, {header: value})  # type: ignore[dict-item]
        assert response.status_code == 400, response.text
        assert error_of(response)["field"] == header and header in error_of(response)["message"]
    assert upstream.received == []
