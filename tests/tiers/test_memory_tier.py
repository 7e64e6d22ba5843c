import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from ragcache.errors import ConfigError
from ragcache.tiers import MemoryTier

DIM = 4
ROW_BYTES = DIM * 4  # float32


# Every key these tests use: the tier keeps digests, not key strings, so its LRU order is asked about them.
ALL = [*"abcdef", "zzz", *(f"k{i}" for i in range(200))]


def tier_of(rows: int) -> MemoryTier:
    return MemoryTier(rows * ROW_BYTES, DIM, torch.float32)


def vec(*values: float) -> torch.Tensor:
    return torch.tensor([[v] * DIM for v in values], dtype=torch.float32)


def test_byte_budget_is_never_exceeded():
    tier = MemoryTier(10 * ROW_BYTES + ROW_BYTES - 1, DIM, torch.float32)  # room for 10 rows, not 11
    assert tier.num_rows == 10 and tier.slab_bytes <= tier.capacity_bytes
    tier.put_many([f"k{i}" for i in range(25)], torch.randn(25, DIM))
    assert len(tier) == 10 and tier.used_bytes == 10 * ROW_BYTES <= tier.capacity_bytes
    with pytest.raises(ConfigError):
        MemoryTier(ROW_BYTES - 1, DIM, torch.float32)


def test_half_precision_holds_twice_the_rows():
    assert MemoryTier(1024, DIM, torch.float16).num_rows == 2 * MemoryTier(1024, DIM, torch.float32).num_rows


def test_exact_lru_eviction_order():
    tier = tier_of(3)
    tier.put_many(["a", "b", "c"], vec(1, 2, 3))
    assert tier.resident_lru_first(ALL) == ["a", "b", "c"]
    tier.get_many(["a"])  # a becomes most recent: b is next out
    assert tier.resident_lru_first(ALL) == ["b", "c", "a"]
    tier.put_many(["d"], vec(4))
    assert tier.resident_lru_first(ALL) == ["c", "a", "d"] and tier.num_evicted == 1
    tier.put_many(["c"], vec(30))  # re-put refreshes and overwrites in place
    tier.put_many(["e", "f"], vec(5, 6))
    assert tier.resident_lru_first(ALL) == ["c", "e", "f"] and tier.num_evicted == 3
    hits = tier.get_many(["a", "c", "d", "e", "f"])
    assert hits.index == [1, 3, 4]
    assert torch.equal(hits.vectors, vec(30, 5, 6))


def test_a_miss_does_not_change_recency():
    tier = tier_of(2)
    tier.put_many(["a", "b"], vec(1, 2))
    tier.get_many(["zzz"])
    assert tier.resident_lru_first(ALL) == ["a", "b"]


def test_batch_larger_than_capacity_keeps_its_last_keys():
    tier = tier_of(3)
    tier.put_many([f"k{i}" for i in range(7)], vec(*range(7)))
    assert tier.resident_lru_first(ALL) == ["k4", "k5", "k6"]
    assert torch.equal(tier.get_many(["k6"]).vectors, vec(6))


def test_duplicate_keys_in_one_put_keep_the_last_vector():
    tier = tier_of(4)
    tier.put_many(["a", "b", "a"], vec(1, 2, 3))
    assert len(tier) == 2 and torch.equal(tier.get_many(["a"]).vectors, vec(3))


def test_concurrent_threads_never_see_a_wrong_vector():
    tier = tier_of(64)
    errors: list[str] = []

    def worker(seed: int) -> None:
        for round_ in range(200):
            keys = [f"k{(seed * 7 + round_ + i) % 150}" for i in range(8)]
            values = [float(k[1:]) for k in keys]
            tier.put_many(keys, vec(*values))
            hits = tier.get_many(keys)
            for position, row in zip(hits.index, hits.vectors):
                if row[0].item() != values[position]:
                    errors.append(f"{keys[position]} -> {row[0].item()}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(tier) == 64


def test_device_auto_is_cuda_when_present_else_cpu():
    from ragcache.tiers.memory import resolve_device

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert MemoryTier(1024, DIM, torch.float32, device="auto").slab.device.type == expected
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ConfigError, match="unknown device"):
        resolve_device("tpu9")


def test_close_drops_the_arrays_without_touching_pages_never_used():
    # In a child, to read its resident memory alone. The map of a 1.5 GB L1 has ~64 MB of arrays that nothing has
    # written yet (numpy's zeros are untouched pages); clearing them at close faulted every page in (issue 38:
    # 3.3 -> 8.1 GB at one service's shutdown). Dropped, they cost nothing and come back to the system.
    code = f"""
import os, sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r})
import torch
from ragcache.tiers.memory import MemoryTier
def rss(): return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
tier = MemoryTier(1536 << 20, 384, torch.float32)
tier.put_many(["a", "b"], torch.ones(2, 384))
before = rss()
tier.close()
print(rss() - before, len(tier.get_many(["a"]).index))
tier.put_many(["c"], torch.ones(1, 384))  # stored nowhere, no error
print(len(tier.get_many(["c"]).index))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    grown, hits, hits_after = (int(word) for word in done.stdout.split())
    assert grown < 8 << 20, f"close faulted in {grown >> 20} MiB"
    assert hits == 0 and hits_after == 0  # a closed L1 holds nothing
