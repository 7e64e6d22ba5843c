"""The L1 key map (ragcache.tiers.lru_index): probing, tombstones and rebuilds, and exact LRU order at scale,
checked against an OrderedDict model of the same operations."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ragcache.core.keys import key_digests
from ragcache.tiers.lru_index import LruIndex


def test_random_operations_match_an_exact_lru_model():
    rng = np.random.default_rng(7)
    num_rows = 50
    index = LruIndex(num_rows)
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


def test_tombstones_are_rebuilt_away_and_every_key_stays_findable():
    index = LruIndex(8)
    keys = [f"k{i}" for i in range(1000)]
    for start in range(0, len(keys), 4):  # 1,000 inserts into 8 rows: 992 evictions, many rebuilds
        index.insert(key_digests(keys[start : start + 4]))
        resident = keys[max(0, start - 4) : start + 4]
        assert (index.find(key_digests(resident)) >= 0).all()
    assert (index.find(key_digests(keys[:992])) < 0).all()
    assert index.num_live == 8
