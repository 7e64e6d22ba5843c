"""What a failed request writes to the log (ragcache_server/errors.py): one line for an expected failure (an
upstream or level down, slow, refused, its breaker open; the queue full), a traceback only for the unexpected,
and at most TRACEBACKS_PER_WINDOW of those a minute, so a failing path cannot flood the log."""

from __future__ import annotations

import logging

from ragcache.errors import OverloadedError, TierUnavailableError, UpstreamTimeoutError, UpstreamUnavailableError
from ragcache_server.errors import TRACEBACKS_PER_WINDOW, TracebackBudget, log_failure


def test_expected_failures_log_one_line_without_a_traceback(caplog):
    budget = TracebackBudget()
    expected = [UpstreamUnavailableError("m", "the upstream is down and skipped for a moment"), UpstreamTimeoutError("m", "slow"),
                TierUnavailableError("L2", "refused"), OverloadedError("queue full")]
    with caplog.at_level(logging.WARNING, logger="ragcache_server.errors"):
        for error in expected:
            log_failure(budget, "POST /rerank", error)
    assert len(caplog.records) == len(expected)
    assert all(record.exc_info is None and record.levelno == logging.WARNING for record in caplog.records)
    assert "Traceback" not in caplog.text and "skipped for a moment" in caplog.text


def test_unexpected_failures_log_tracebacks_within_a_budget_per_minute(caplog):
    now = [0.0]
    budget = TracebackBudget(clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="ragcache_server.errors"):
        for index in range(TRACEBACKS_PER_WINDOW + 15):
            try:
                raise RuntimeError(f"bug {index}")
            except RuntimeError as exc:
                log_failure(budget, "GET /stats", exc)
        with_traceback = [record for record in caplog.records if record.exc_info]
        assert len(with_traceback) == TRACEBACKS_PER_WINDOW and len(caplog.records) == TRACEBACKS_PER_WINDOW + 15
        assert caplog.text.count("Traceback") == TRACEBACKS_PER_WINDOW
        caplog.clear()
        now[0] = 61.0  # a new window: tracebacks again, saying how many were skipped
        log_failure(budget, "GET /stats", RuntimeError("bug again"))
    assert caplog.records[0].exc_info is not None and "15 tracebacks skipped" in caplog.text
