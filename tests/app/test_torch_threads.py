"""torch's intra-op threads while the service runs (ragcache.app.torch_threads): one when every model is remote."""

import json
import threading

import torch

from ragcache.app import torch_threads
from ragcache.settings import Settings
from ragcache_server.state import local_models


def _in_new_thread() -> int:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


def test_remote_only_runs_one_thread_while_inside_and_torch_default_after():
    before = torch.get_num_threads()
    with torch_threads(0, any_local_model=False) as threads:
        assert threads == 1
        assert torch.get_num_threads() == 1
        assert _in_new_thread() == 1  # the service's worker threads start after it is entered
    assert torch.get_num_threads() == before
    assert _in_new_thread() == before


def test_a_local_model_keeps_torch_default_unless_asked():
    before = torch.get_num_threads()
    with torch_threads(0, any_local_model=True) as threads:
        assert threads is None and torch.get_num_threads() == before
    with torch_threads(3, any_local_model=True) as threads:
        assert threads == 3 and torch.get_num_threads() == 3
    assert torch.get_num_threads() == before


def test_local_models_leaves_out_the_models_a_remote_model_names():
    remote = [{"name": "upstream-model", "provider": "openai", "base_url": "http://127.0.0.1:9/v1", "dimensions": 8, "upstream_model": "m"}]
    settings = Settings(model="upstream-model", extra_models=["sentence-transformers/all-MiniLM-L6-v2"],
                        models_json=json.dumps({"models": remote}), redis_url="off", milvus_uri="off")
    assert local_models(settings) == ["sentence-transformers/all-MiniLM-L6-v2"]
    assert local_models(Settings(redis_url="off", milvus_uri="off")) == settings.space.models[1:]
