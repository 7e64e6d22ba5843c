"""Requests that miss L1 together are walked together (ragcache_server/embedding/groups.py), each answered and counted
as its own, and a failing text fails only its own request. A real service over loopback HTTP; the remote model is
a small OpenAI-compatible server of the test's own that holds its answers while a gate is closed (so that requests
gather behind the walks in flight) and refuses, 400, any request with a text containing "poison"."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

from ragcache.settings import Settings
from ragcache.storage.processes import poll_until
from tests.live_server import LiveServer

DIM = 8
WAIT_S = 30.0


def vector_of(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


class GatedUpstream:
    def __init__(self):
        self.gate = threading.Event()
        self.num_calls = 0
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                upstream.num_calls += 1
                assert upstream.gate.wait(WAIT_S)
                texts = body["input"]
                if any("poison" in text for text in texts):
                    self._answer(400, {"error": {"message": "this text is refused"}})
                    return
                data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(vector_of(t).tobytes()).decode()}
                        for i, t in enumerate(texts)]
                self._answer(200, {"object": "list", "data": data, "model": "gated",
                                   "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)}})

            def _answer(self, status: int, payload: dict) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def models_json(self) -> str:
        return json.dumps({"models": [{"name": "gated", "provider": "openai", "base_url": self.url, "upstream_model": "gated",
                                       "dimensions": DIM, "max_retries": 0}]})

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()


@pytest.fixture()
def service(tmp_path):
    upstream = GatedUpstream()
    settings = Settings(models_json=upstream.models_json(), model="gated", redis_url="off", milvus_uri="off",
                        data_dir=tmp_path, drift_check=False)
    try:
        with LiveServer(settings) as server:
            yield server, upstream
    finally:
        upstream.close()


def _post(url: str, texts: list[str]) -> httpx.Response:
    return httpx.post(url + "/v1/embeddings", json={"model": "gated", "input": texts, "encoding_format": "base64"},
                      timeout=WAIT_S)


def _vectors(response: httpx.Response) -> np.ndarray:
    return np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in response.json()["data"]])


def _gather_behind_two_walks(server, upstream, pool: ThreadPoolExecutor, late: list[list[str]]):
    """Two requests walk (held at the upstream's gate); ``late`` arrive meanwhile and gather into one group."""
    groups = server.app.state.embed_groups
    # One at a time: two requests that reach the service in one turn of its loop would share one group.
    early = [pool.submit(_post, server.url, ["early 0"])]
    assert poll_until(lambda: groups.num_groups == 1 and upstream.num_calls == 1, timeout_s=WAIT_S), "a walk at the gate"
    early.append(pool.submit(_post, server.url, ["early 1"]))
    assert poll_until(lambda: groups.num_groups == 2, timeout_s=WAIT_S), "a second walk, waiting for the model"
    waiting = [pool.submit(_post, server.url, texts) for texts in late]
    assert poll_until(lambda: groups.num_waiting == len(late), timeout_s=WAIT_S), "the late requests gathered"
    upstream.gate.set()
    return [future.result() for future in early], [future.result() for future in waiting]


def test_requests_that_arrive_together_are_walked_in_one_group_and_answered_each_as_its_own(service):
    server, upstream = service
    late = [[f"late {i} a", f"late {i} b", "shared"] for i in range(3)]
    with ThreadPoolExecutor(8) as pool:
        early, answers = _gather_behind_two_walks(server, upstream, pool, late)
    groups = server.app.state.embed_groups
    assert groups.num_groups == 3 and groups.num_grouped == 3  # the three late requests: one walk
    for response in early:
        assert response.status_code == 200
    for response, texts in zip(answers, late):
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(_vectors(response), np.stack([vector_of(t) for t in texts]))
        assert response.headers["x-cache-compute"] == "3" and response.json()["usage"]["prompt_tokens"] > 0
    stats = httpx.get(server.url + "/stats").json()["models"]["gated"]["since_start"]
    assert (stats["requests"], stats["texts"], stats["texts_computed"]) == (5, 11, 11)


def test_a_text_that_fails_fails_only_its_own_request_of_the_group(service):
    server, upstream = service
    late = [["fine 1", "fine 2"], ["fine 3", "poison pill"], ["fine 4"]]
    with ThreadPoolExecutor(8) as pool:
        _, answers = _gather_behind_two_walks(server, upstream, pool, late)
    assert server.app.state.embed_groups.num_grouped == 3
    good = [answers[0], answers[2]]
    for response, texts in zip(good, (late[0], late[2])):
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(_vectors(response), np.stack([vector_of(t) for t in texts]))
    # Its own answer, as when it is sent alone: the upstream's refusal of its text.
    assert answers[1].status_code == 502 and "this text is refused" in answers[1].json()["error"]["message"]
