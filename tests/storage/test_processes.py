"""ragcache.storage.processes.poll_until: the one wait-until-ready loop (embedded Redis, Redis Cluster, Milvus Lite,
the service, vLLM, Infinity all wait through it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ragcache.storage.processes import ProcessExited, poll_until


def test_ready_after_a_few_refusals():
    answers = iter([ConnectionRefusedError(), ConnectionRefusedError(), False, True])

    def ready():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert poll_until(ready, timeout_s=30, interval_s=0.001, not_yet=(OSError,)) is True


def test_an_unexpected_error_is_not_swallowed():
    def ready():
        raise ValueError("a bug, not a server still starting")

    with pytest.raises(ValueError):
        poll_until(ready, timeout_s=30, not_yet=(OSError,))


def test_never_ready_is_false_after_the_timeout():
    assert poll_until(lambda: False, timeout_s=0.05, interval_s=0.01) is False


def test_a_process_that_exits_ends_the_wait_at_once():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait(timeout=30)
    with pytest.raises(ProcessExited, match="exited with 3") as caught:
        poll_until(lambda: False, timeout_s=3600, process=process, name="the child")
    assert caught.value.returncode == 3
