"""The same contract, run against every level: memory (L1), the disk level (LMDB), Redis and Redis Cluster (L2),
Milvus Lite (L3)."""

import uuid

import pytest
import torch

from ragcache.storage.disk_store import DiskStore
from ragcache.tiers import DiskTier, MemoryTier, MilvusTier, RedisTier

DIM = 16


def make_keys(n: int, space_id: str = "0123456789abcdef") -> list[str]:
    return [f"rc:{space_id}:{uuid.uuid4().hex}" for _ in range(n)]


@pytest.fixture(params=["memory", "disk", "redis", "redis_cluster", "milvus"])
def make_tier(request, tmp_path):
    def make(dtype: torch.dtype = torch.float32):
        if request.param == "memory":
            return MemoryTier(1 << 20, DIM, dtype)
        if request.param == "disk":
            store = DiskStore(tmp_path / f"disk-{uuid.uuid4().hex[:8]}", capacity_bytes=8 << 20)
            request.addfinalizer(store.close)
            return DiskTier(store, dim=DIM, dtype=dtype)
        if request.param in ("redis", "redis_cluster"):
            return RedisTier(request.getfixturevalue(f"{request.param}_client"), dim=DIM, dtype=dtype, ttl_s=60)
        space_id = uuid.uuid4().hex[:16]
        return MilvusTier(request.getfixturevalue("milvus_client"), space_id=space_id, dim=DIM, dtype=dtype)

    return make


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_is_bit_exact(make_tier, dtype):
    tier = make_tier(dtype)
    keys = make_keys(5)
    vectors = torch.randn(5, DIM).to(dtype)
    tier.put_many(keys, vectors)
    hits = tier.get_many(keys)
    assert hits.index == [0, 1, 2, 3, 4]
    assert hits.vectors.dtype == dtype
    assert torch.equal(hits.vectors.cpu().view(torch.uint8), vectors.view(torch.uint8))


def test_misses_are_absent_and_hits_keep_their_positions(make_tier):
    tier = make_tier()
    keys = make_keys(4)
    vectors = torch.randn(4, DIM)
    tier.put_many([keys[1], keys[3]], vectors[[1, 3]])
    hits = tier.get_many(keys)
    assert hits.index == [1, 3]
    assert torch.equal(hits.vectors.cpu(), vectors[[1, 3]])


def test_empty_and_all_missing_batches(make_tier):
    tier = make_tier()
    assert tier.get_many([]).index == []
    hits = tier.get_many(make_keys(3))
    assert hits.index == [] and hits.vectors.shape == (0, DIM)


def test_put_overwrites(make_tier):
    tier = make_tier()
    keys = make_keys(2)
    tier.put_many(keys, torch.zeros(2, DIM))
    tier.put_many(keys, torch.ones(2, DIM))
    hits = tier.get_many(keys)
    assert len(hits.index) == 2 and torch.equal(hits.vectors.cpu(), torch.ones(2, DIM))
