"""``bench kv``'s workload logic (the measurement itself runs against a real vLLM: ``make bench-kv``)."""

from __future__ import annotations

import collections

from ragcache.prefixes import assemble_prompt
from ragcache_bench.kv import KVConfig, format_report, naive_prompt, questions, rag_requests


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


def test_questions_are_unique_and_the_same_for_every_configuration():
    config = KVConfig()
    assert questions(config, 16, 4) == questions(config, 16, 4)
    assert len(set(questions(config, 16, 4))) == 16


def test_report_table_has_a_row_per_level():
    row = dict(configuration="on", concurrency=4, num_requests=12, ttft_p50_ms=1.0, ttft_p90_ms=2.0,
               tokens_per_s=3.0, prompt_tokens_per_request=100.0, cached_tokens_per_request=96.0,
               vllm_hit_tokens=None, seconds=1.0)
    report = {"label": "CPU", "prefix_tokens": 100, "config": {"max_tokens": 16}, "rows": [row], "rag": [],
              "rag_ratio": None, "seconds": 1.0}
    table = format_report(report)
    assert "| on | 4 | 12 | 1.0 | 2.0 | 3.0 | 96.0 of 100.0 | n/a |" in table
