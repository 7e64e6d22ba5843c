"""A short version of ``ragcache bench load``: a bounded mixed load on the real service process.

Zero failed requests, every endpoint exercised, L1 within its byte budget, and the service's resident
memory not growing without bound. The full run (60 s, 50 clients) is ``ragcache bench load``; its figures
are in docs/reliability.md.
"""

from __future__ import annotations

import pytest

from ragcache_bench.load import run_load

pytestmark = pytest.mark.slow


def test_mixed_load_has_no_errors_and_stable_memory(tmp_path):
    result = run_load(duration_s=12.0, clients=20, l1_bytes=256 * 1024, num_documents=200, workdir=tmp_path)
    summary = result.summary
    mib = 1024 * 1024
    print(f"\nLOAD short: {summary.num_requests} requests, {summary.num_failed} failed, {summary.by_endpoint}; "
          f"p50 {summary.latency_p50_ms} ms p99 {summary.latency_p99_ms} ms; RSS {result.rss_start_bytes / mib:.0f} -> "
          f"{result.rss_end_bytes / mib:.0f} MiB; L1 {result.l1_used_bytes} of {result.l1_budget_bytes} bytes")
    assert summary.num_failed == 0, summary.first_errors
    assert set(summary.by_endpoint) == {"/embed", "/v1/embeddings", "/search"}
    assert min(summary.by_endpoint.values()) > 10
    assert 0 < result.l1_used_bytes <= result.l1_budget_bytes == 256 * 1024
    # Bounded: a quarter over the warmed-up size would be a leak (measured: a few MiB over ~650 MiB).
    assert result.rss_end_bytes < 1.25 * result.rss_start_bytes
