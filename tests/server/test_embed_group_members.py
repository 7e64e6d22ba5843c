"""A group of embedding requests does not couple its members (issue 38.6) and asks L1 at most twice for a missed text
(issue 41.3): a member whose every text a level above the model holds is answered as soon as the group's lookup is
done, while another member's new texts wait on a slow model; each member's resident probe is the group walk's first
step. Real levels (the L1 memory tier, the disk level on a real LMDB store) and the real ``EmbedGroups``; the model is
a stand-in passed in through the cache's constructor that holds the texts marked "new" until the test releases them."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from ragcache.core import EmbeddingCache, Probe, TierHits
from ragcache.core.levels import Levels
from ragcache.storage.disk_store import DiskStore
from ragcache.tiers.disk import DiskTier
from ragcache.tiers.memory import MemoryTier
from ragcache_server.embedding import EmbedGroups
from tests.fakes import HashEncoder

DIM = 16
WAIT_S = 30.0  # a safety net against a hang, never a measure: nothing here asserts on time


class GatedEncoder(HashEncoder):
    """Holds every call that carries a text starting with "new" until ``gate`` is set; ``entered`` says one arrived."""

    def __init__(self):
        super().__init__(dim=DIM)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        if any(text.startswith("new") for text in texts):
            self.entered.set()
            assert self.gate.wait(WAIT_S)
        return super().encode(texts)


class CountingTier:
    """The real L1, with every key it is asked about counted."""

    def __init__(self, inner: MemoryTier):
        self.inner = inner
        self.name = inner.name
        self.asked: Counter[str] = Counter()

    def get_many(self, keys: Sequence[str]) -> TierHits:
        self.asked.update(keys)
        return self.inner.get_many(keys)

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None:
        self.inner.put_many(keys, vectors)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_member_the_levels_hold_is_answered_while_another_members_new_texts_wait_on_the_model(tmp_path):
    encoder = GatedEncoder()
    l1 = CountingTier(MemoryTier(2 * DIM * 4, DIM, torch.float32))  # two vectors
    store = DiskStore(tmp_path, capacity_bytes=4 << 20)
    levels = Levels([l1, DiskTier(store, dim=DIM, dtype=torch.float32)], dim=DIM, dtype=torch.float32, write_behind=False)
    cache = EmbeddingCache(encoder, levels)
    held_texts = ["held 0", "held 1"]
    try:
        expected = cache.embed(held_texts)
        cache.embed(["filler 0", "filler 1"])  # L1 holds two vectors: the held texts are now on the disk level only
        l1.asked.clear()
        answered_a = asyncio.run(_two_members(cache, encoder, held_texts))
    finally:
        encoder.gate.set()
        cache.close()
        store.close()
    result_a, result_b, probe_a, probe_b, order = answered_a
    assert order == ["A", "B"]  # A answered while B's text was held at the model
    np.testing.assert_array_equal(result_a.vectors, expected)
    assert result_a.served == {"L1": 0, "disk": 2, "compute": 0} and result_b.served == {"L1": 0, "disk": 0, "compute": 1}
    np.testing.assert_array_equal(result_b.vectors, HashEncoder(DIM).encode(["new 0"]).numpy())
    # L1 asked once for each held text (the probe) and twice for the missed one (the probe, the batcher's last look):
    # the group's walk took both probes' answers as its first step.
    assert {key: l1.asked[key] for key in [*probe_a.keys, *probe_b.keys]} == {probe_a.keys[0]: 1, probe_a.keys[1]: 1,
                                                                               probe_b.keys[0]: 2}


async def _two_members(cache: EmbeddingCache, encoder: GatedEncoder, held_texts: list[str]):
    groups = EmbedGroups(asyncio.to_thread)
    probe_b, probe_a = cache.probe(["new 0"]), cache.probe(held_texts)
    assert isinstance(probe_a, Probe) and isinstance(probe_b, Probe)  # neither is all in L1: both walk
    order: list[str] = []

    async def member(name: str, texts: list[str], probe: Probe):
        result, _ = await groups.embed(cache, texts, probe=probe, normalize=False)
        order.append(name)
        return result

    task_b = asyncio.create_task(member("B", ["new 0"], probe_b))
    task_a = asyncio.create_task(member("A", held_texts, probe_a))
    result_a = await asyncio.wait_for(task_a, WAIT_S)
    assert groups.num_groups == 1 and groups.num_grouped == 2  # one walk for both
    assert not encoder.gate.is_set() and not task_b.done()  # B's text cannot have been computed yet
    encoder.gate.set()
    result_b = await asyncio.wait_for(task_b, WAIT_S)
    return result_a, result_b, probe_a, probe_b, order
