"""``bench kv``'s workload logic (the measurement itself runs against a real vLLM: ``make bench-kv``)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import random
import socket

import httpx
import pytest

from ragcache.prefixes import PrefixRegistryConfig, PrefixSpec, Target, assemble_prompt
from ragcache_bench import exit_status, kv_route
from ragcache_bench.kv_blocks import LevelResult
from ragcache_bench.kv_keep_warm import KeepWarm, KeepWarmProcessError, registry_config
from ragcache_bench.kv_rag import naive_prompt, rag_requests
from ragcache_bench.kv_report import format_report, verdicts
from ragcache_bench.kv_workload import (
    UNREGISTERED,
    KVConfig,
    RequestResult,
    StreamError,
    questions,
    stream_one,
    user_lanes,
)


def test_rag_requests_are_deterministic_zipf_draws_of_distinct_chunks():
    config = KVConfig(seed=3)
    first = rag_requests(config, 200, 50, 4, 1.1, chunk_words=5)
    assert first == rag_requests(config, 200, 50, 4, 1.1, chunk_words=5)
    assert all(len({c.id for c in chunks}) == 4 for chunks, _ in first)
    counts = collections.Counter(c.id for chunks, _ in first for c in chunks)
    popular = [doc_id for doc_id, _ in counts.most_common(5)]
    assert counts[popular[0]] > 4 * counts.most_common()[-1][1]  # skewed, as Zipf is
    assert popular != sorted(popular)  # ids say nothing about popularity


def test_naive_and_assembled_prompts_differ_only_in_order_and_placement():
    chunks, question = rag_requests(KVConfig(), 1, 20, 3, 1.1, chunk_words=3)[0]
    naive = naive_prompt("SYS\n", chunks, question, "T1")
    assembled = assemble_prompt("SYS\n", chunks, f"Current time: T1\n{question}")
    assert sorted(naive) == sorted(assembled)  # the same characters
    assert naive.startswith("SYS\nCurrent time: T1\n") and assembled.endswith(question)


def test_questions_are_unique_and_the_same_for_every_configuration_of_a_block():
    config = KVConfig()
    assert questions(config, 16, 4, 0) == questions(config, 16, 4, 0)
    assert len(set(questions(config, 16, 4, 0) + questions(config, 16, 4, 1))) == 32  # fresh per block


def test_users_alternate_the_registered_prefix_and_the_unregistered_one():
    registered, unregistered = [f"r{i}" for i in range(8)], [f"u{i}" for i in range(8)]
    lanes = user_lanes(registered, unregistered, 4)
    # Every prompt sent once, each user switching prefix at every request, half the users starting on each.
    assert sorted(p for lane in lanes for _, p in lane) == sorted(registered + unregistered)
    for lane in lanes:
        tags = [tag for tag, _ in lane]
        assert all(a != b for a, b in zip(tags, tags[1:], strict=False)) and len(lane) == 4
        assert all(p.startswith("u" if tag == UNREGISTERED else "r") for tag, p in lane)
    assert [lane[0][0] for lane in lanes] == ["", UNREGISTERED, "", UNREGISTERED]


def _row(configuration: str, concurrency: int, *, ttft: float, cached: float = 0.0, errors: int = 0) -> LevelResult:
    return LevelResult(configuration, concurrency, 12, errors, ttft, 2 * ttft, 3.0, 1320.0, cached, None, 1.0)


def test_report_table_has_a_row_per_level():
    details = {"label": "CPU", "prefix_tokens": 100, "config": {"max_tokens": 16, "rounds": 3},
               "churn_tokens_per_s_measured": 4000.0, "kv_cache_cycle_s": 2.0,
               "rows": [dataclasses.asdict(_row("on", 4, ttft=1.0, cached=96.0))], "rag": [], "rag_ratio": None}
    table = format_report(details)
    assert "| on | 4 | 12 | 0 | 1.0 | 2.0 | 3.0 | 96.0 of 1320.0 | n/a |" in table
    assert "3 alternating blocks" in table and "cycled every 2.0 s" in table


def test_verdicts_per_concurrency_and_a_failed_stream_fails_its_level():
    rows = [_row("off", 1, ttft=100.0), _row("on", 1, ttft=40.0, cached=1280.0),
            _row("on+churn", 1, ttft=60.0), _row("on+churn+keep-warm", 1, ttft=62.0, cached=1280.0),
            _row("off", 16, ttft=300.0), _row("on", 16, ttft=200.0, cached=1280.0),
            _row("on+churn", 16, ttft=200.0, cached=1280.0),
            _row("on+churn+keep-warm", 16, ttft=230.0, cached=1000.0, errors=1)]
    result = verdicts(rows, 1301, (1, 16))
    verdict = {f.name: f.verdict for f in result.figures}
    assert verdict == {
        "TTFT p50 caching on / off, c=1": "PASS",
        "cached tokens with keep-warm under churn, c=1": "PASS",  # 1280 of 1301 = 98.4%
        "TTFT p50 keep-warm / none under churn, c=1": "PASS",  # 62 / 60 = 1.033
        "TTFT p50 caching on / off, c=16": "PASS",
        "cached tokens with keep-warm under churn, c=16": "MISS",  # 76.9%, and a stream failed
        "TTFT p50 keep-warm / none under churn, c=16": "MISS",  # 1.15x
    }
    assert result.num_missed == 2 and exit_status([result]) == 1
    fast = [_row("on+churn", 1, ttft=60.0), _row("on+churn+keep-warm", 1, ttft=50.0, cached=1280.0, errors=1)]
    (cached, ttft) = verdicts(fast, 1301, (1,)).figures
    assert ttft.verdict == "MISS" and ttft.failed_requirements == ["every stream carried a token"]


def _sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _stream(body: bytes, status: int = 200) -> RequestResult:
    async def go() -> RequestResult:
        transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))
        async with httpx.AsyncClient(transport=transport) as http:
            return await stream_one(http, Target("http://vllm.test", "m"), "prompt", 4)

    return asyncio.run(go())


def test_a_stream_without_a_token_is_an_error_not_a_ttft():
    usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 0}}
    with pytest.raises(StreamError, match="without a token"):
        _stream(_sse(usage))
    with pytest.raises(StreamError, match="503"):
        _stream(b"busy", status=503)
    ok = _stream(_sse({"choices": [{"text": "a"}]}, {"choices": [], "usage": {
        "prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 8}}}))
    assert (ok.num_prompt_tokens, ok.num_cached_tokens, ok.num_completion_tokens) == (10, 8, 1)
    assert 0 <= ok.ttft_s <= ok.latency_s


def test_registry_settings_start_at_the_defaults_and_change_only_what_is_named():
    config = registry_config(32, ["min_rewarm_interval_s=0.2", "warm_max_running=none", "warm_budget_per_minute=300"])
    defaults = PrefixRegistryConfig()
    assert (config.min_rewarm_interval_s, config.warm_max_running, config.warm_budget_per_minute) == (0.2, None, 300)
    assert (config.max_rewarm_interval_s, config.tick_interval_s, config.initial_rewarm_interval_s) == (
        defaults.max_rewarm_interval_s, defaults.tick_interval_s, defaults.initial_rewarm_interval_s)
    assert config.default_block_size == 32
    with pytest.raises(SystemExit):
        registry_config(32, ["redis_key=x"])


def test_a_chat_prefix_is_judged_by_its_warms_per_eviction():
    def stats(warms: int, evicted: int) -> dict:
        return {"num_warms": warms, "num_evicted": evicted, "num_resident": warms - evicted}

    events = {"num_warms_sent": 10, "prefix": stats(6, 5), "extras": {"chat": stats(9, 6)}}
    (figure,) = verdicts([], 1301, (4,), {"on+churn+keep-warm (events)": events}).figures
    assert (figure.value, figure.verdict) == (1.5, "PASS") and "completion prefix: 6 warms, 5 evicted" in figure.note
    events["extras"] = {"chat": stats(9, 0)}  # never seen evicted: no figure to judge it by
    (figure,) = verdicts([], 1301, (4,), {"on+churn+keep-warm (events)": events}).figures
    assert figure.verdict == "MISS" and figure.failed_requirements == ["an eviction was seen"]


def test_a_keep_warm_command_that_raises_comes_back_as_its_traceback():
    # Issue 42: a registry process whose command raised used to leave the bench waiting 120 s for "did not answer".
    spec = PrefixSpec("system", "You are a helpful assistant. " * 8, Target("http://127.0.0.1:9", ""), pinned=False)
    keep_warm = KeepWarm(registry_config(16, []), spec, answer_timeout_s=60)
    try:
        with pytest.raises(KeepWarmProcessError, match="failed a pin") as info:
            keep_warm.set(True)
        assert "target model must not be empty" in str(info.value)
    finally:
        keep_warm.close()


def test_a_keep_warm_process_that_hangs_is_reported_with_its_threads_stacks():
    # A vLLM that accepts the connection and never answers: the pin's warm waits on it past the bench's patience.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        target = Target(f"http://127.0.0.1:{silent.getsockname()[1]}", "m")
        spec = PrefixSpec("system", "You are a helpful assistant. " * 8, target, pinned=False)
        keep_warm = KeepWarm(registry_config(16, ["request_timeout_s=60", "read_timeout_s=60"]), spec,
                             answer_timeout_s=5)
        try:
            with pytest.raises(KeepWarmProcessError, match="did not answer a pin within 5s; it is alive") as info:
                keep_warm.set(True)
            assert "in register" in str(info.value)  # the main thread's stack: where it waits
        finally:
            keep_warm.close()


def test_a_kv_route_block_measures_only_after_its_untimed_settling_requests():
    # Issue 42: each block began from the other mode's leftovers (routed from round-robin's mixed replicas, round-robin
    # from the routed partition), pulling both figures toward each other; now each block settles untimed first.
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url.host))
        return httpx.Response(200, json={"usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}})

    args = argparse.Namespace(suffix_tokens=2, concurrency=2, requests_per_block=5, settle_requests=3)
    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        samples = kv_route._block("round_robin", None, http, ["http://a", "http://b"], "m",  # type: ignore[arg-type]
                                  {"alpha": [1, 2], "beta": [3, 4]}, args, random.Random(0), collections.Counter())
    assert len(samples) == 5 and len(seen) == 8
    assert [s[1:] for s in samples if s is not None] == [(2, 3)] * 5
