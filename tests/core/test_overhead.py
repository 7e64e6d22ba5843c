"""The steps a request costs, counted (issue 22): what the CPU per text of ``ragcache bench overhead`` is made of.

Timed targets live in the benchmark; these tests pin the counts that decide them, with the instant upstream of
the benchmark as the model (a real OpenAI-compatible server in its own process) and the session's real Redis:
a text is hashed once per request, however many times L1 is asked about it; an all-miss request costs L2 one
read and one write, whatever its size. A regression in either fails here before any benchmark runs.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import pytest
import redis

from ragcache import Settings, open_cache
from ragcache.core.cache import EmbedResult, Probe
from ragcache_testing.instant import InstantUpstream

NUM_TEXTS = 32


@pytest.fixture(scope="module")
def upstream():
    with InstantUpstream() as server:
        yield server


def settings_of(upstream, redis_url, data_dir) -> Settings:
    return Settings(models_json=upstream.models_json, model=upstream.model, redis_url=redis_url, milvus_uri="off",
                    data_dir=data_dir, drift_check=False, single_flight=False)


@pytest.fixture
def cache(upstream, redis_url, tmp_path):
    with open_cache(settings_of(upstream, redis_url, tmp_path)) as cache:
        yield cache


def fresh_texts(label: str) -> list[str]:
    return [f"{label} {time.time_ns()} text {i}" for i in range(NUM_TEXTS)]


def hash_calls(work) -> Counter:
    """Hash calls made by ``work()`` in this thread (a profile hook sees every C call): xxhash's by function name,
    BLAKE2b's (the text hash) as ``blake2b.hexdigest``, one per digest made."""
    calls: Counter = Counter()

    def hook(frame, event, function):
        if event != "c_call":
            return
        name = getattr(function, "__name__", "")
        if name.startswith("xxh3_"):
            calls[name] += 1
        elif name == "hexdigest" and type(getattr(function, "__self__", None)).__name__ == "blake2b":
            calls["blake2b.hexdigest"] += 1

    sys.setprofile(hook)
    try:
        work()
    finally:
        sys.setprofile(None)
    return calls


def test_a_request_not_wholly_in_l1_hashes_each_text_once(cache, upstream, redis_url, tmp_path):
    """The service's path: a resident probe on the event loop, then the walk continues from it (L1's answer,
    the keys and their L1 digests carried over). Texts in L2, not L1: the whole walk runs in this thread. The
    texts were embedded by another process's cache (here: another cache), so this one has never keyed them."""
    texts = fresh_texts("hash-once")
    with open_cache(settings_of(upstream, redis_url, tmp_path / "writer")) as writer:
        writer.embed(texts)
        writer.flush()
    cache.embed(fresh_texts("other"))  # its space (hashed once per cache and scope) is made before the count

    def request() -> EmbedResult:
        outcome = cache.probe(texts)
        assert isinstance(outcome, Probe)
        return cache.embed_detailed(texts, probe=outcome)

    calls = hash_calls(request)
    assert calls["blake2b.hexdigest"] == NUM_TEXTS  # the text hash, in the key
    assert calls["xxh3_128_hexdigest"] == 0
    assert calls["xxh3_128_digest"] == NUM_TEXTS  # L1's digest of the key: probe, lookup and write-up share it
    result = cache.embed_detailed(texts)
    assert result.served["L1"] == NUM_TEXTS  # the walk wrote the L2 hits up into L1
    # Asked again (L1 emptied: the walk runs again): the keys are remembered (KeyMemo), nothing is hashed.
    cache.tiers[0].clear()
    again = hash_calls(request)
    assert again["blake2b.hexdigest"] == 0 and again["xxh3_128_digest"] == 0


def test_a_probe_of_other_texts_is_refused(cache):
    outcome = cache.probe(fresh_texts("one"))
    assert isinstance(outcome, Probe)
    with pytest.raises(ValueError, match="probe"):
        cache.embed_detailed(fresh_texts("other") + ["one more"], probe=outcome)


def test_an_all_miss_request_costs_l2_one_read_and_one_write(cache, redis_url):
    client = redis.Redis.from_url(redis_url)
    cache.embed(fresh_texts("warm"))  # the script is loaded, connections open
    cache.flush()
    before = client.info("commandstats")
    num_requests = 10
    for _ in range(num_requests):
        result = cache.embed_detailed(fresh_texts("miss"))
        assert result.served["compute"] == NUM_TEXTS
    cache.flush()
    after = client.info("commandstats")
    client.close()

    def calls(command: str) -> int:
        return after.get(f"cmdstat_{command}", {}).get("calls", 0) - before.get(f"cmdstat_{command}", {}).get("calls", 0)

    assert calls("mget") == num_requests  # one read per request, not one per text
    assert 1 <= calls("evalsha") <= num_requests  # one write per request at most (the write-behind may gather)
    assert calls("get") == 0  # no read per text
