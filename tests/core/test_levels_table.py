"""The table of levels builds the ``Levels`` (issue 41.1): a level's name, linger, admission and reach come from its
row, whatever its tier's own default name; a tier's optional abilities are declared protocols
(``ragcache.core.tier``), not attributes probed for. Real L1 slabs and real stores; the model is a fake."""

import pytest
import torch

from ragcache.build import LevelRow, build_levels
from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.core.tier import Expiring, Figured, MayHold
from ragcache.errors import ConfigError
from ragcache.settings import Settings
from ragcache.storage.stores import Stores
from ragcache.tiers import MemoryTier
from tests.fakes import HashEncoder

DIM = 8


def slab(settings, stores, space, device):
    return MemoryTier(100 * space.dim * 4, space.dim, torch.float32, device=device)


def test_the_rows_name_the_levels_and_say_their_linger_admission_and_reach():
    encoder = HashEncoder(DIM)
    rows = (
        LevelRow("near", "process", slab),
        LevelRow("nowhere", "host", lambda settings, stores, space, device: None),  # turned off: no level
        LevelRow("far", "fleet", slab, write_linger_ms=lambda settings: 5.0, on_reuse=lambda settings: True),
    )
    levels = build_levels(Settings(), Stores(None, None), encoder.space, torch.device("cpu"), rows=rows)
    assert levels.names == ("near", "far")  # the rows' names, not the tiers' own ("L1")
    assert levels.shared == 1 and levels.on_reuse == frozenset({1})
    with EmbeddingCache(encoder, levels) as cache:
        assert cache.embed_detailed(["a"]).served == {"near": 0, "far": 0, "compute": 1}
        assert cache.embed_detailed(["a"]).served == {"near": 1, "far": 0, "compute": 0}
        states = cache.level_states()
        assert set(states) == {"near", "far"}
        assert states["far"]["admission"] == "reuse" and states["far"]["num_declined"] == 1


def test_levels_need_one_distinct_name_each():
    with pytest.raises(ValueError, match="distinct name"):
        Levels([MemoryTier(1 << 12, DIM, torch.float32), MemoryTier(1 << 12, DIM, torch.float32)], dim=DIM, dtype=torch.float32)
    with pytest.raises(ValueError, match="distinct name"):
        Levels([MemoryTier(1 << 12, DIM, torch.float32)], names=["a", "b"], dim=DIM, dtype=torch.float32)


def test_levels_built_for_other_vectors_than_the_models_are_refused():
    levels = Levels([MemoryTier(1 << 12, 4, torch.float32)], dim=4, dtype=torch.float32)
    with pytest.raises(ConfigError, match="4-d"):
        EmbeddingCache(HashEncoder(DIM), levels)


class Bare:
    """A level with no ability beyond the protocol's, and attributes that are not a declared ability."""

    name = "L1"
    num_corrupt = 7
    ttl_s = 3.0  # an attribute alone is an ability (Expiring declares a value, not a method)

    def __init__(self):
        self.tier = MemoryTier(1 << 12, DIM, torch.float32)

    def get_many(self, keys):
        return self.tier.get_many(keys)

    def put_many(self, keys, vectors):
        self.tier.put_many(keys, vectors)

    def close(self):
        pass


def test_a_tiers_abilities_are_the_protocols_it_meets():
    memory = MemoryTier(1 << 12, DIM, torch.float32)
    assert isinstance(memory, Figured) and not isinstance(memory, MayHold) and not isinstance(memory, Expiring)
    assert memory.figures() == {"used_bytes": 0, "capacity_bytes": 1 << 12, "num_evicted": 0}
    bare = Bare()
    assert not isinstance(bare, Figured) and isinstance(bare, Expiring)
    levels = Levels([bare], dim=DIM, dtype=torch.float32)
    assert "num_corrupt" not in levels.states()["L1"]  # figures are shown through ``figures()`` only
    assert levels.ttl_s == (3.0,)
