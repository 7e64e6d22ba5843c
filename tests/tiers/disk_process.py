"""A process on the disk level, for the multi-process tests: ``write START STOP`` stores keys START..STOP-1
(printing each batch's last index as it lands), ``read STOP ROUNDS`` reads keys 0..STOP-1 ROUNDS times and
prints how many hits it saw, failing if any hit is not the vector of its key."""

from __future__ import annotations

import sys

import torch

from ragcache.storage.disk_store import DiskStore
from ragcache.tiers.disk import DiskTier

DIM = 64
BATCH = 32


def key(i: int) -> str:
    return f"rc:disktest:{i:09d}"


def vector(i: int) -> torch.Tensor:
    return torch.arange(DIM, dtype=torch.float32) + float(i)


def open_tier(root: str, capacity_bytes: int) -> DiskTier:
    return DiskTier(DiskStore(root, capacity_bytes=capacity_bytes, num_generations=4), dim=DIM, dtype=torch.float32)


def write(tier: DiskTier, start: int, stop: int) -> None:
    for first in range(start, stop, BATCH):
        ids = range(first, min(first + BATCH, stop))
        tier.put_many([key(i) for i in ids], torch.stack([vector(i) for i in ids]))
        print(ids[-1], flush=True)


def read(tier: DiskTier, stop: int, rounds: int) -> int:
    num_hits = 0
    for _ in range(rounds):
        for first in range(0, stop, BATCH):
            ids = list(range(first, min(first + BATCH, stop)))
            hits = tier.get_many([key(i) for i in ids])
            expected = torch.stack([vector(ids[p]) for p in hits.index]) if hits.index else hits.vectors
            if not torch.equal(hits.vectors, expected):
                raise SystemExit("a hit that is not its key's vector")
            num_hits += len(hits.index)
    return num_hits


if __name__ == "__main__":
    root, capacity, command, *numbers = sys.argv[1:]
    disk = open_tier(root, int(capacity))
    if command == "write":
        write(disk, int(numbers[0]), int(numbers[1]))
    else:
        print(read(disk, int(numbers[0]), int(numbers[1])), flush=True)
    disk.store.close()
