"""Bounded work: worker threads, the model's queue, texts nobody waits for, list lengths, slow bodies.

The logic runs against a slow fake encoder passed through the constructor (``ComputeBatcher(encode)``) and
``WorkerPool`` directly; the service tests flood a real server (the real model) and trickle a body over a
real socket. Every wait is bounded (``WAIT_S``) as a hang detector; nothing asserts how long anything took.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx
import pytest
import torch

from ragcache.core.batching import CALLER_GONE, ComputeBatcher
from ragcache.errors import OverloadedError, RagCacheError
from ragcache.settings import MAX_BATCH_CEILING, Settings
from ragcache_server.workers import WorkerPool
from tests.errors import error_of
from tests.live_server import LiveServer

WAIT_S = 30.0


class GatedEncoder:
    """Encodes a text as a 2-d vector of its length; while ``gate`` is clear, each call blocks on it."""

    def __init__(self):
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.texts_encoded: list[str] = []

    def __call__(self, texts):
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        self.texts_encoded.extend(texts)
        return torch.tensor([[float(len(text)), 1.0] for text in texts])


def until(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {WAIT_S} s")
        time.sleep(0.01)


def in_thread(target, *args) -> tuple[threading.Thread, list]:
    """Run ``target(*args)`` in a thread; its result or exception lands in the returned list."""
    outcome: list = []

    def run():
        try:
            outcome.append(target(*args))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def compute_as(batcher: ComputeBatcher, texts: list[str], gone: threading.Event | None = None):
    """``batcher.compute`` from a caller that sets ``gone`` when it stops waiting."""
    CALLER_GONE.set(gone)
    return batcher.compute([f"k:{text}" for text in texts], texts)


@pytest.fixture
def gated():
    encoder = GatedEncoder()
    batcher = ComputeBatcher(encoder, max_batch=2, max_wait_s=0, max_pending=3)
    try:
        yield encoder, batcher
    finally:
        encoder.gate.set()
        batcher.close()


def test_a_full_queue_refuses_new_texts_and_queues_none_of_them(gated):
    encoder, batcher = gated
    first, first_out = in_thread(compute_as, batcher, ["a1", "a2"])  # taken by the model, which blocks
    assert encoder.entered.wait(WAIT_S)
    second, second_out = in_thread(compute_as, batcher, ["b1", "b2", "b3"])
    until(lambda: batcher.num_pending == 3, "three texts queued")
    with pytest.raises(OverloadedError, match="compute_max_pending"):
        compute_as(batcher, ["c1"])
    assert batcher.num_pending == 3 and batcher.num_refused == 1  # nothing of the refused call was queued
    encoder.gate.set()
    for thread in (first, second):
        thread.join(WAIT_S)
    assert [vector[0].item() for vector in second_out[0]] == [2.0, 2.0, 2.0]
    assert "c1" not in encoder.texts_encoded


def test_a_call_larger_than_the_queue_still_fits_into_an_empty_one(gated):
    encoder, batcher = gated
    encoder.gate.set()
    assert compute_as(batcher, ["x1", "x2", "x3", "x4", "x5"]).shape == (5, 2)  # max_pending is 3


def test_texts_whose_callers_have_all_gone_are_dropped_and_shared_ones_kept(gated):
    encoder, batcher = gated
    busy, _ = in_thread(compute_as, batcher, ["a1", "a2"])
    assert encoder.entered.wait(WAIT_S)
    gone_b, gone_c = threading.Event(), threading.Event()
    b, b_out = in_thread(compute_as, batcher, ["only-b", "shared"], gone_b)
    until(lambda: batcher.num_pending == 2, "b's texts queued")
    c, c_out = in_thread(compute_as, batcher, ["shared", "only-c"], gone_c)
    until(lambda: batcher.num_pending == 3, "c's new text queued")
    gone_b.set()  # b's request was answered 504: it stops waiting
    b.join(WAIT_S)
    assert isinstance(b_out[0], RagCacheError) and "stopped waiting" in str(b_out[0])
    assert batcher.num_pending == 2 and batcher.num_dropped == 1  # "only-b" left the queue; "shared" stays for c
    encoder.gate.set()
    for thread in (busy, c):
        thread.join(WAIT_S)
    assert c_out[0].shape == (2, 2)
    assert "only-b" not in encoder.texts_encoded and "shared" in encoder.texts_encoded


def test_the_worker_pool_counts_abandoned_calls_until_they_end():
    """Six calls on a pool of two, all cancelled while the first two block: two threads run on (abandoned),
    the other four never start, and the slots come back only when the threads end."""
    pool = WorkerPool(max_threads=2)
    release = threading.Event()
    started: list[int] = []
    concurrent = [0, 0]  # now, most
    lock = threading.Lock()

    def block(number: int) -> int:
        with lock:
            started.append(number)
            concurrent[0] += 1
            concurrent[1] = max(concurrent[1], concurrent[0])
        release.wait(WAIT_S)
        with lock:
            concurrent[0] -= 1
        return number

    async def main() -> tuple[int, int]:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                for number in range(6):
                    group.start_soon(pool.run, block, number)
                with anyio.fail_after(WAIT_S):
                    while len(started) < 2:
                        await anyio.sleep(0.01)
                await anyio.sleep(0.1)  # a chance for a third to start, were the pool not bounded
                scope.cancel()
        running_after_cancel = pool.num_running
        release.set()
        with anyio.fail_after(WAIT_S):
            while pool.num_running:
                await anyio.sleep(0.01)
        return running_after_cancel, await pool.run(block, 99)

    running_after_cancel, last = anyio.run(main)
    assert running_after_cancel == 2 and set(started[:2]) == {0, 1} and started[2:] == [99]  # 2-5 never ran
    assert last == 99 and concurrent[1] == 2


# ---- the service -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=tmp_path_factory.mktemp("bounded"),
                        max_worker_threads=3, compute_max_pending=64, compute_batch_size=8,
                        request_timeout_s=0.5, body_timeout_s=1.0)
    with LiveServer(settings) as live:
        yield live


def test_a_flood_of_requests_that_time_out_stays_within_the_thread_and_queue_bounds(small_server):
    live = small_server
    pool, batcher = live.app.state.workers, next(iter(live.state.caches.values())).resolver.batcher
    most = {"running": 0, "pending": 0}
    flooding = threading.Event()

    def watch() -> None:
        while not flooding.is_set():
            most["running"] = max(most["running"], pool.num_running)
            most["pending"] = max(most["pending"], batcher.num_pending)
            time.sleep(0.001)

    def send(number: int) -> httpx.Response:
        texts = [f"flood {number} text {i} {time.monotonic()}" for i in range(32)]
        return httpx.post(live.url + "/embed", json={"inputs": texts}, timeout=WAIT_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with ThreadPoolExecutor(max_workers=40) as executor:
        responses = list(executor.map(send, range(120)))
    until(lambda: pool.num_running == 0 and batcher.num_pending == 0, "the abandoned work to drain")
    flooding.set()
    watcher.join(WAIT_S)

    statuses = {response.status_code for response in responses}
    assert statuses <= {200, 503, 504} and statuses & {503, 504}, statuses
    assert most["running"] <= 3, most  # before: a thread per request answered 504 (121 of 150)
    assert most["pending"] <= 64, most
    assert batcher.num_dropped > 0  # texts of requests answered 504 were not computed for nobody
    for response in responses:
        if response.status_code == 503:
            assert error_of(response)["type"] == "overloaded" and int(response.headers["Retry-After"]) >= 1
    assert httpx.post(live.url + "/embed", json={"inputs": ["after the flood"]}, timeout=WAIT_S).status_code == 200


def test_a_trickled_body_is_cut_off_with_408(small_server):
    host, port = "127.0.0.1", small_server.port
    with socket.create_connection((host, port), timeout=WAIT_S) as conn:
        conn.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        answered = False
        for _ in range(int(WAIT_S / 0.2)):  # a byte every 0.2 s: never done, never idle
            conn.sendall(b" ")
            if select.select([conn], [], [], 0.2)[0]:
                answered = True
                break
        assert answered, "the server never cut off a body trickling in"
        response = conn.recv(65536).decode()
    assert response.startswith("HTTP/1.1 408"), response[:200]
    assert "RAGCACHE_BODY_TIMEOUT_S" in response


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/documents", {"collection": "c", "documents": [{"id": "a", "text": ""}] * (MAX_BATCH_CEILING + 1)}, "documents"),
        ("/embed", {"inputs": ["x"] * (MAX_BATCH_CEILING + 1)}, "inputs"),
        ("/v1/embeddings", {"input": ["x"] * (MAX_BATCH_CEILING + 1)}, "input"),
    ],
)
def test_a_list_over_the_ceiling_is_refused_by_validation(small_server, path, body, field):
    response = httpx.post(small_server.url + path, content=json.dumps(body), timeout=WAIT_S,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == (400 if path.startswith("/v1/") else 422), response.text  # OpenAI's 400 on /v1
    assert error_of(response)["field"] == field and "at most" in error_of(response)["message"]
