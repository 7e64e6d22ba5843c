"""The compiled L1 loops (ragcache/tiers/_lru_kernels.c) refuse what they cannot serve safely: a bound written so
that no caller-given size can overflow it, and buffers misaligned for their items (issue 38, item 8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragcache.tiers.lru_index import compiled_kernels

pytestmark = pytest.mark.skipif(compiled_kernels is None, reason="the compiled loops are not built here")
ROOT = str(Path(__file__).parents[2])


def log_of(capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(8, dtype=np.int64), np.zeros(capacity, dtype=np.int32), np.zeros(capacity, dtype=np.int64)


def misaligned(count: int, dtype: type) -> np.ndarray:
    """``count`` items of ``dtype`` one byte past an aligned address."""
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(bytearray(count * itemsize + 1), dtype=dtype, count=count, offset=1)


def test_a_tail_whose_sum_with_the_count_would_overflow_is_refused():
    # In a child: before, `tail + count` wrapped to a negative number, passed the bound, and the log was written
    # far outside itself (a segfault at best).
    code = f"""
import sys; sys.path.insert(0, {ROOT!r})
import numpy as np
from ragcache.tiers.lru_index import compiled_kernels as k
stamp, log_rows, log_ticks = np.zeros(8, np.int64), np.zeros(16, np.int32), np.zeros(16, np.int64)
try:
    k.touch(np.array([1, 2], np.int64), stamp, log_rows, log_ticks, sys.maxsize, 0)
except ValueError:
    print("refused")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "refused", (done.returncode, done.stderr[-2000:])


def test_a_tick_that_would_overflow_is_refused():
    stamp, log_rows, log_ticks = log_of(16)
    with pytest.raises(ValueError):
        compiled_kernels.touch(np.array([1], np.int64), stamp, log_rows, log_ticks, 0, np.iinfo(np.int64).max)
    assert not stamp.any() and not log_ticks.any()


def test_a_touch_that_fills_the_log_exactly_is_taken():
    stamp, log_rows, log_ticks = log_of(4)
    compiled_kernels.touch(np.array([1, 2], np.int64), stamp, log_rows, log_ticks, 2, 10)
    assert log_rows.tolist() == [0, 0, 1, 2] and log_ticks.tolist() == [0, 0, 11, 12] and stamp[[1, 2]].tolist() == [11, 12]
    with pytest.raises(ValueError):
        compiled_kernels.touch(np.array([1], np.int64), stamp, log_rows, log_ticks, 4, 12)


@pytest.mark.parametrize("which", ["rows", "stamp", "log_rows", "log_ticks"])
def test_touch_refuses_a_misaligned_buffer(which):
    arrays = {"rows": np.array([1], np.int64), "stamp": np.zeros(8, np.int64), "log_rows": np.zeros(16, np.int32),
              "log_ticks": np.zeros(16, np.int64)}
    arrays[which] = misaligned(len(arrays[which]), arrays[which].dtype.type)
    with pytest.raises(ValueError, match="aligned"):
        compiled_kernels.touch(arrays["rows"], arrays["stamp"], arrays["log_rows"], arrays["log_ticks"], 0, 0)


@pytest.mark.parametrize("which", ["keys", "hi", "lo", "slot_row", "rows_out"])
def test_find_refuses_a_misaligned_buffer(which):
    size = 64
    arrays = {"keys": np.zeros((2, 2), np.uint64), "hi": np.zeros(size, np.uint64), "lo": np.zeros(size, np.uint64),
              "slot_row": np.full(size, -1, np.int32), "rows_out": np.zeros(2, np.int64)}
    arrays[which] = misaligned(arrays[which].size, arrays[which].dtype.type)
    with pytest.raises(ValueError, match="aligned"):
        compiled_kernels.find(arrays["keys"], arrays["hi"], arrays["lo"], arrays["slot_row"], size - 1, arrays["rows_out"])
    with pytest.raises(ValueError, match="aligned"):
        compiled_kernels.find_hits(arrays["keys"], arrays["hi"], arrays["lo"], arrays["slot_row"], size - 1,
                                   np.zeros(2, np.int64), arrays["rows_out"])
