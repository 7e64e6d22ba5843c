"""Redis (L2) failing under load: stopped and started again, paused, or holding corrupt values.

The real service runs (uvicorn, in a thread) over a real redis-server on a fixed port; a bounded background
load (``ragcache_bench.load.LoadRunner``, 4 clients) sends /embed and /v1/embeddings throughout. L1 is kept
tiny so that most texts are looked up in L2. Measured times are printed (``pytest -s``) for docs/reliability.md;
they are never asserted (the machine is shared), only what must hold: no request fails, the level is skipped
while down and used again once back.
"""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
import redis
import torch

from ragcache.settings import Settings
from ragcache.storage.embedded_redis import EmbeddedRedis, free_port
from ragcache.tiers.redis import decode_values, encode_value
from ragcache_bench.load import LoadRunner, Workload, summarize
from tests.live_server import LiveServer

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
CLIENTS = 4


class RestartableRedis:
    """A redis-server on a fixed port and folder, stopped and started again as a new process."""

    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.port = free_port()
        self.server: EmbeddedRedis | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.server = EmbeddedRedis(self.data_dir, port=self.port)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="module")
def redis_and_service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults-redis")
    store = RestartableRedis(folder / "redis")
    # 64 vectors of L1: most texts of the load come from L2. Short timeouts: a stuck Redis costs little.
    settings = Settings(redis_url=store.url, milvus_uri="off", data_dir=folder / "data", l1_bytes=64 * 384 * 4, redis_timeout_s=0.25)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        hot = workload(seed=0).hot_texts
        for start in range(0, len(hot), 100):  # computed once, in big batches: L2 holds them all
            assert client.post("/embed", json={"inputs": hot[start : start + 100]}).status_code == 200
        yield store, server
    store.stop()


def workload(seed: int) -> Workload:
    """300 texts sent equally often (L1 holds 64 of them: the rest come from L2), 2% never seen before."""
    return Workload(paths=("/embed", "/v1/embeddings"), skew=0, new_fraction=0.02, seed=seed)


def l2_state(client: httpx.Client) -> dict:
    entry = client.get("/stats").json()["models"][MODEL]
    level = next(level for level in entry["since_start"]["levels"] if level["level"] == "L2")
    return {**entry["levels"]["L2"], "hits": level["hits"], "errors": level["errors"]}


def wait_for(predicate, timeout_s: float = 60.0, interval_s: float = 0.05):
    """Poll until ``predicate()`` is truthy; returns (value, seconds waited). Fails the test at the deadline."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        value = predicate()
        if value:
            return value, time.monotonic() - started
        time.sleep(interval_s)
    pytest.fail(f"not within {timeout_s} s: {predicate}")


def test_redis_stopped_and_restarted_under_load(redis_and_service):
    store, server = redis_and_service
    with httpx.Client(base_url=server.url, timeout=60) as client:
        load = LoadRunner(server.url, workload(seed=1), clients=CLIENTS).start()
        try:
            wait_for(lambda: l2_state(client)["hits"] > 50)  # L2 is in use before the outage
            outages_before = l2_state(client)["num_outages"]
            store.stop()
            stopped_at = time.monotonic()
            state, _ = wait_for(lambda: (state := l2_state(client))["down_for_s"] is not None and state)
            # The service runs in this process: its clock is ours, so the opening time needs no polling error.
            open_s = time.monotonic() - state["down_for_s"] - stopped_at
            max_failures = 0
            while time.monotonic() - stopped_at < 4.0:  # the outage: watch how often L2 is actually tried
                max_failures = max(max_failures, l2_state(client)["num_failures"])
                time.sleep(0.1)
            during = [o for o in load.outcomes if o.started_s >= stopped_at]
            store.start()
            restarted_at = time.monotonic()
            hits_at_restart = l2_state(client)["hits"]
            _, recovery_s = wait_for(lambda: l2_state(client)["up"])
            wait_for(lambda: l2_state(client)["hits"] > hits_at_restart)  # used again, not merely marked up
            used_s = time.monotonic() - restarted_at
            time.sleep(1.0)
        finally:
            outcomes = load.stop()
        after = l2_state(client)
    summary = summarize(outcomes)
    print(f"\nFAULT redis-stop: {summary.num_requests} requests, {summary.num_failed} failed; {len(during)} sent while down; "
          f"circuit open {open_s:.3f} s after the stop, {max_failures} tries of L2 during the 4 s outage; "
          f"up again {recovery_s:.2f} s after the restart, L2 hits again {used_s:.2f} s after it; "
          f"latency p50 {summary.latency_p50_ms} ms p99 {summary.latency_p99_ms} ms "
          f"max {summary.latency_max_ms} ms")
    assert summary.num_failed == 0, summary.first_errors
    assert after["num_outages"] == outages_before + 1
    # Skipped while down: far fewer tries of L2 than requests (one probe per back-off, not one per request).
    assert len(during) > 2 * max_failures > 0
    assert after["up"] and after["hits"] > hits_at_restart


def test_paused_redis_costs_a_bounded_wait_and_no_failure(redis_and_service):
    store, server = redis_and_service
    pause_s = 3.0
    with httpx.Client(base_url=server.url, timeout=60) as client, redis.Redis.from_url(store.url) as admin:
        load = LoadRunner(server.url, workload(seed=2), clients=CLIENTS).start()
        try:
            wait_for(lambda: len(load.outcomes) > 20)
            outages_before = l2_state(client)["num_outages"]
            admin.execute_command("CLIENT", "PAUSE", str(int(pause_s * 1000)), "ALL")
            paused_at = time.monotonic()
            state, _ = wait_for(lambda: (state := l2_state(client))["num_outages"] > outages_before and state)
            open_s = time.monotonic() - (state["down_for_s"] or 0.0) - paused_at
            time.sleep(max(0.0, pause_s - (time.monotonic() - paused_at)))
            _, recovery_s = wait_for(lambda: l2_state(client)["up"])
            time.sleep(1.0)
        finally:
            outcomes = load.stop()
    during = [o for o in outcomes if paused_at <= o.started_s < paused_at + pause_s]
    summary, during_summary = summarize(outcomes), summarize(during)
    print(f"\nFAULT redis-pause: CLIENT PAUSE {pause_s:.0f} s, timeout 0.25 s: {summary.num_requests} requests, "
          f"{summary.num_failed} failed; {during_summary.num_requests} sent while paused: p50 {during_summary.latency_p50_ms} ms, "
          f"max {during_summary.latency_max_ms} ms; circuit open {open_s:.3f} s after the pause began; up again {recovery_s:.2f} s "
          f"after the pause ended (polled)")
    assert summary.num_failed == 0, summary.first_errors
    assert during, "no request was sent while Redis was paused"


def test_corrupt_truncated_and_foreign_values_are_replaced_never_served(redis_and_service):
    store, server = redis_and_service
    cache = server.state.caches[MODEL]
    texts = ["a value cut short in Redis", "a value with one flipped bit", "a value some other cache wrote"]
    keys = cache.space.keys(texts)
    valid = encode_value(np.random.default_rng(0).standard_normal(384, dtype=np.float32).tobytes(), torch.float32, 384)
    flipped = valid[:-1] + bytes([valid[-1] ^ 1])
    damaged = [valid[:-7], flipped, b'{"embedding": [0.1, 0.2]}']
    with httpx.Client(base_url=server.url, timeout=60) as client, redis.Redis.from_url(store.url) as admin:
        wait_for(lambda: l2_state(client)["up"])
        corrupt_before = l2_state(client)["num_corrupt"]
        for key, value in zip(keys, damaged):
            admin.set(key, value)
        response = client.post("/embed", json={"inputs": texts})
        assert response.status_code == 200
        assert response.headers["x-cache-compute"] == "3" and response.headers["x-cache-l2"] == "0"
        np.testing.assert_allclose(np.array(response.json()), cache.encoder.encode(texts).cpu().numpy(), atol=1e-5)
        assert l2_state(client)["num_corrupt"] == corrupt_before + 3
        # Replaced: the write-behind stores the computed vectors, which decode as valid values.
        wait_for(lambda: len(decode_values(admin.mget(keys), torch.float32, 384)[0]) == 3)
