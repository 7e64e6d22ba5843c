"""The L1 key map (ragcache.tiers.lru_index): probing, tombstones and rebuilds, and exact LRU order at scale,
checked against an OrderedDict model of the same operations, with the compiled loops and with numpy's."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from ragcache.core.keys import key_digests
from ragcache.tiers.lru_index import LRU_KERNELS, LruIndex, compiled_kernels


@pytest.fixture
def kernels(implementation):
    """The compiled loops and their numpy twin (tests/conftest.py's ``implementation``): every test runs on both."""
    return LRU_KERNELS.of(implementation)


def test_the_compiled_loops_are_built():
    # `make install` builds them (a C compiler is part of this machine kind): without them every other test here
    # would run numpy's loops twice and pass, and the served path would be the slower one.
    assert compiled_kernels is not None


def test_random_operations_match_an_exact_lru_model(kernels):
    rng = np.random.default_rng(7)
    num_rows = 50
    index = LruIndex(num_rows, kernels=kernels)
    model: OrderedDict[str, int] = OrderedDict()  # key -> row, least recent first
    universe = [f"key-{i}" for i in range(400)]
    for _ in range(3000):
        if rng.random() < 0.01:  # clear keeps the arrays: it must leave an index that behaves as a new one
            index.clear()
            model.clear()
        batch = list(dict.fromkeys(rng.choice(universe, size=int(rng.integers(1, 12))).tolist()))
        wanted = key_digests(batch)
        rows = index.find(wanted)
        for key, row in zip(batch, rows):
            assert (key in model) == (row >= 0) and (row < 0 or model[key] == row)
        positions, found = index.find_hits(wanted)
        assert positions.tolist() == np.flatnonzero(rows >= 0).tolist() and found.tolist() == rows[rows >= 0].tolist()
        if rng.random() < 0.5:  # a lookup: hits become most recent, in order
            hits = rows[rows >= 0]
            index.touch(hits)
            for key, row in zip(batch, rows):
                if row >= 0:
                    model.move_to_end(key)
        else:  # a store: resident keys refreshed first, new keys take free or least recently used rows
            index.touch(rows[rows >= 0])
            for key, row in zip(batch, rows):
                if row >= 0:
                    model.move_to_end(key)
            new = np.flatnonzero(rows < 0)
            if len(new):
                victims = list(model)[: max(0, len(model) + len(new) - num_rows)]
                given = index.insert(wanted[new])
                freed = [model.pop(victim) for victim in victims]
                assert set(given.tolist()) >= set(freed)
                for position, row in zip(new, given):
                    model[batch[position]] = int(row)
            rows = index.find(wanted)
            index.touch(rows)
            for key in batch:
                model.move_to_end(key)
        assert index.num_live == len(model)
        assert index.lru_rows().tolist() == list(model.values())


def test_tombstones_are_rebuilt_away_and_every_key_stays_findable(kernels):
    index = LruIndex(8, kernels=kernels)
    keys = [f"k{i}" for i in range(1000)]
    for start in range(0, len(keys), 4):  # 1,000 inserts into 8 rows: 992 evictions, many rebuilds
        index.insert(key_digests(keys[start : start + 4]))
        resident = keys[max(0, start - 4) : start + 4]
        assert (index.find(key_digests(resident)) >= 0).all()
    assert (index.find(key_digests(keys[:992])) < 0).all()
    assert index.num_live == 8


def test_a_row_used_twice_in_one_touch_keeps_its_last_use(kernels):
    index = LruIndex(4, kernels=kernels)
    rows = index.insert(key_digests(["a", "b", "c", "d"]))
    index.touch(np.array([rows[0], rows[1], rows[0], rows[2]]))  # a, then b, then a again, then c
    assert index.lru_rows().tolist() == [rows[3], rows[1], rows[0], rows[2]]
    for _ in range(5):  # many more uses than the log holds entries: it is compacted, the order kept
        index.touch(np.repeat(rows[[1, 3]], 7))
    assert index.lru_rows().tolist() == [rows[0], rows[2], rows[1], rows[3]]


def test_without_the_compiled_loops_the_twin_serves_and_a_warning_says_so():
    # In a child where the extension cannot be imported (an install without a C compiler).
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
import sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r})
sys.modules["ragcache.tiers._lru_kernels"] = None  # import fails as if it was never built
from ragcache.observe.compiled import implementations
from ragcache.tiers.lru_index import LRU_KERNELS, LruIndex
from ragcache.core.keys import key_digests
index = LruIndex(4)
rows = index.insert(key_digests(["a", "b"]))
print(implementations()["lru_kernels"], LRU_KERNELS.serving.__name__, index.find(key_digests(["b", "c"])).tolist() == [rows[1], -1])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["python", "ragcache.tiers._lru_loops", "True"]
    assert "the compiled lru_kernels (ragcache.tiers._lru_kernels) is not built" in done.stderr


def test_the_choice_is_visible():
    from ragcache.observe.compiled import implementations

    assert implementations()["lru_kernels"] == "compiled"  # built by `make install` here
