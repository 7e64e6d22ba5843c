"""A process on the disk level, for the multi-process tests: ``write START STOP`` stores keys START..STOP-1
(printing each batch's last index as it lands), ``read STOP ROUNDS`` reads keys 0..STOP-1 ROUNDS times and
prints how many hits it saw, failing if any hit is not the vector of its key; ``idle START STOP`` writes like
``write``, prints ``idle`` and then makes no call until a line arrives on stdin (the watch thread alone runs).
``probe``, ``cut-while-open`` and ``full-volume`` are the fault scenarios of test_disk_faults.py, each printing
its figures as one JSON line (a SIGBUS kills this process, not the test run)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

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


def probe(tier: DiskTier, stop: int) -> dict:
    """Read keys 0..stop-1 once: hits, hits that are not their key's vector, generations lost."""
    ids = list(range(stop))
    hits = tier.get_many([key(i) for i in ids])
    wrong = sum(not torch.equal(row, vector(ids[p])) for p, row in zip(hits.index, hits.vectors))
    return {"num_hits": len(hits.index), "wrong": wrong, "num_lost": tier.store.figures().num_lost}


def cut_while_open(tier: DiskTier, stop: int) -> dict:
    """Write, cut the newest generation's data file in half under the open store, check, then read."""
    write(tier, 0, stop)
    data = sorted(Path(tier.store.root).glob("gen-*/data.mdb"))[-1]
    os.truncate(data, data.stat().st_size // 2)
    tier.store.check()
    return probe(tier, stop)


def full_volume(root: str, capacity: int, filler: Path) -> dict:
    """Write until the volume is full, read through the levels, then free the filler and wait for the level."""
    from ragcache.core.levels import Levels
    from ragcache.storage.disk_store import DiskStore

    store = DiskStore(root, capacity_bytes=capacity, min_free_bytes=128 << 10, check_interval_s=0.05)
    tier = DiskTier(store, dim=DIM, dtype=torch.float32)
    levels = Levels([tier], dim=DIM, dtype=torch.float32, write_behind=False)
    for first in range(0, 200_000, BATCH):
        if store.figures().unavailable is not None:
            break
        levels.store(0, [key(i) for i in range(first, first + BATCH)], torch.stack([vector(i) for i in range(first, first + BATCH)]))
    levels.lookup(0, [key(i) for i in range(BATCH)])
    state = levels.states()["disk"]
    result = {"down": not state["up"], "last_error": state["last_error"], "errors": levels.snapshots(recent=False)[0].errors}
    filler.unlink()
    deadline = time.monotonic() + 60
    while store.figures().unavailable is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    result["back"] = store.figures().unavailable is None
    ids = range(10**6, 10**6 + BATCH)
    tier.put_many([key(i) for i in ids], torch.stack([vector(i) for i in ids]))
    result["hits_after"] = len(tier.get_many([key(i) for i in ids]).index)
    result["num_lost"] = store.figures().num_lost
    store.close()
    return result


if __name__ == "__main__":
    root, capacity, command, *numbers = sys.argv[1:]
    if command == "full-volume":
        print(json.dumps(full_volume(root, int(capacity), Path(numbers[0]))), flush=True)
        raise SystemExit(0)
    disk = open_tier(root, int(capacity))
    if command in ("write", "idle"):
        write(disk, int(numbers[0]), int(numbers[1]))
        if command == "idle":
            print("idle", flush=True)
            sys.stdin.readline()
    elif command == "probe":
        print(json.dumps(probe(disk, int(numbers[0]))), flush=True)
    elif command == "cut-while-open":
        print(json.dumps(cut_while_open(disk, int(numbers[0]))), flush=True)
    else:
        print(read(disk, int(numbers[0]), int(numbers[1])), flush=True)
    disk.store.close()
