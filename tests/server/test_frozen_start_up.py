"""While the service runs, what its start-up made is frozen out of the cyclic collector (``gc.freeze``), so that a
full collection scans only what requests made since; when it stops, those objects are thawed again, so an app
started and stopped inside a longer process leaves nothing frozen behind (ragcache_server/app.py)."""

from __future__ import annotations

import gc

import httpx

from ragcache.settings import Settings
from tests.live_server import LiveServer


def test_start_up_is_frozen_while_serving_and_thawed_after(tmp_path):
    assert gc.get_freeze_count() == 0
    with LiveServer(Settings(redis_url="off", milvus_uri="off", data_dir=tmp_path)) as live:
        # The packaged model, its tokenizer and the libraries: hundreds of thousands of objects.
        assert gc.get_freeze_count() > 100_000
        answer = httpx.post(f"{live.url}/embed", json={"inputs": ["frozen start-up"]}, timeout=60)
        assert answer.status_code == 200
        assert len(answer.json()[0]) == 384
        gc.collect()  # a full collection while serving leaves the frozen objects where they are
        assert gc.get_freeze_count() > 100_000
    assert gc.get_freeze_count() == 0
