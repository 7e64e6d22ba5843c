"""One live service (real Redis, Milvus Lite, the packaged model, API keys) shared by the client and adapter tests
that need no special model: each module writes collections of its own names, so they do not meet, and the process
starts one service (one model, one Milvus Lite) instead of one per module."""

from __future__ import annotations

import json

import pytest

from ragcache.settings import Settings
from tests.live_server import LiveServer

KEY = "client-tests-key-0123456789"


@pytest.fixture(scope="package")
def keyed_service(redis_server, tmp_path_factory):
    """The service, with one key of every scope (``KEY``)."""
    keys = json.dumps({"keys": [{"name": "app", "key": KEY, "scopes": "*"}]})
    with LiveServer(Settings(redis_url=redis_server, data_dir=tmp_path_factory.mktemp("client-service"), api_keys=keys)) as live:
        yield live
