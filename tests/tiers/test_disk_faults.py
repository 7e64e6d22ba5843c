"""The disk level when its files or its volume fail (issue 38): a full volume, a data file cut short, a process
that stays idle while another rotates. LMDB maps its files, so each of these could be a SIGBUS: anything that
could fault runs in a child process (tests/tiers/disk_process.py), where a crash is a failed test (exit -7 or
135), not a dead pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ragcache.core.levels import Levels
from ragcache.errors import TierUnavailableError
from ragcache.storage.disk_store import DiskStore
from ragcache.tiers.disk import DiskTier
from tests.tiers.disk_process import DIM, key, open_tier, vector, write

PROCESS = str(Path(__file__).with_name("disk_process.py"))
CAPACITY = 4 << 20
VALUE_BYTES = 16 + DIM * 4
ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))


def run_child(*args: str, timeout: float = 300) -> dict:
    """Run ``disk_process.py`` with ``args``; its last line of output, parsed. A child killed by a signal (a
    SIGBUS from a mapped page the file system cannot back) fails the test with what it printed."""
    done = subprocess.run([sys.executable, PROCESS, *args], capture_output=True, text=True, env=ENV, timeout=timeout)
    assert done.returncode == 0, f"the child exited {done.returncode} (-7: SIGBUS)\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def files_of(root: Path) -> int:
    """Bytes of every file of the store: data and lock files of each generation and of the meta environment."""
    return sum(path.stat().st_size for path in root.rglob("*.mdb"))


# ---- a data file shorter than its meta page says ---------------------------------------------------------------


def cut_newest_in_half(root: Path) -> Path:
    data = sorted(root.glob("gen-*/data.mdb"))[-1]
    os.truncate(data, data.stat().st_size // 2)
    return data


def test_a_generation_cut_short_is_dropped_and_counted_when_opened(tmp_path):
    tier = open_tier(str(tmp_path), CAPACITY)
    write(tier, 0, 2000)
    tier.store.close()
    cut = cut_newest_in_half(tmp_path)
    # Before the length check, LMDB trusted the meta page and the child died of SIGBUS at every start.
    first = run_child(str(tmp_path), str(CAPACITY), "probe", "2000")
    assert first["num_lost"] == 1 and first["num_hits"] < 2000 and first["wrong"] == 0
    assert not cut.parent.exists()
    again = run_child(str(tmp_path), str(CAPACITY), "probe", "2000")  # no crash loop: the next start is clean
    assert again["num_lost"] == 0 and again["num_hits"] == first["num_hits"]


def test_a_generation_cut_short_while_open_is_dropped_by_the_next_check(tmp_path):
    # The child opens the store, the file is cut under it, and its next check must drop it before a read faults.
    result = run_child(str(tmp_path), str(CAPACITY), "cut-while-open", "2000")
    assert result["num_lost"] == 1 and result["wrong"] == 0
    assert result["num_hits"] < 2000


def test_a_data_file_shorter_than_two_pages_is_dropped_without_reading_its_meta(tmp_path):
    tier = open_tier(str(tmp_path), CAPACITY)
    write(tier, 0, 100)
    tier.store.close()
    data = next(tmp_path.glob("gen-*/data.mdb"))
    os.truncate(data, 4096 + 16)  # the second meta page cut: LMDB refuses the file itself
    result = run_child(str(tmp_path), str(CAPACITY), "probe", "100")
    assert result["num_lost"] == 1 and result["num_hits"] == 0


# ---- files allocated before they are mapped ---------------------------------------------------------------------


def test_every_lock_file_is_allocated_before_lmdb_maps_it(tmp_path):
    # LMDB makes a lock file sparse and writes it through a shared mapping: on a full volume the first write to an
    # unbacked page is a SIGBUS. Allocated here first, every page of every lock file has its blocks.
    tier = open_tier(str(tmp_path), CAPACITY)
    try:
        write(tier, 0, 2 * CAPACITY // VALUE_BYTES)  # rotations: lock files of new generations too
        locks = list(tmp_path.rglob("lock.mdb"))
        assert len(locks) >= 5  # the meta environment's and each generation's
        for lock in locks:
            stat = lock.stat()
            assert stat.st_blocks * 512 >= stat.st_size, f"{lock} is sparse"
    finally:
        tier.store.close()


# ---- free space ------------------------------------------------------------------------------------------------


class Volume:
    """The free bytes a store sees, set by the test (``DiskStore(free_space=...)``)."""

    def __init__(self, free: int):
        self.free = free

    def __call__(self, _folder: Path) -> int:
        return self.free


def test_under_the_free_space_margin_the_level_is_unavailable_and_comes_back(tmp_path):
    volume = Volume(1 << 30)
    store = DiskStore(tmp_path, capacity_bytes=CAPACITY, min_free_bytes=64 << 20, check_interval_s=None,
                      free_space=volume)
    tier = DiskTier(store, dim=DIM, dtype=torch.float32)
    levels = Levels([tier], dim=DIM, dtype=torch.float32, write_behind=False)
    try:
        keys = [key(i) for i in range(32)]
        vectors = torch.stack([vector(i) for i in range(32)])
        levels.store(0, keys, vectors)
        volume.free = 10 << 20  # another writer took the volume down under the margin
        store.check()
        assert levels.lookup(0, keys).index == []  # a miss, though the value is there
        states = levels.states()["disk"]
        assert states["up"] is False and "under the margin" in states["last_error"]  # what /health reports
        assert levels.snapshots(recent=False)[0].errors == 32
        with pytest.raises(TierUnavailableError):
            tier.put_many(keys, vectors)
        assert store.figures().num_lost == 0 and store.figures().unavailable is not None
        volume.free = 1 << 30
        store.check()
        assert store.figures().unavailable is None
        assert tier.get_many(keys).index == list(range(32))  # nothing was deleted for it
    finally:
        store.close()


def test_no_generation_is_made_without_room_for_it(tmp_path):
    volume = Volume(1 << 20)  # under the margin from the start: the store opens, unavailable, with no generation
    store = DiskStore(tmp_path, capacity_bytes=CAPACITY, min_free_bytes=64 << 20, check_interval_s=None,
                      free_space=volume)
    try:
        assert list(tmp_path.glob("gen-*")) == [] and store.figures().num_generations == 0
        with pytest.raises(TierUnavailableError, match="under the margin"):
            store.get_many([b"k"])
        volume.free = 1 << 30
        store.check()  # the watch makes the first generation once there is room
        store.put_many([(b"k", b"v")])
        assert store.get_many([b"k"]) == [b"v"]
    finally:
        store.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs to fill it: needs root (CI runs as root)")
def test_a_full_volume_is_a_miss_not_a_crash(tmp_path):
    mount = tmp_path / "volume"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True)
    if mounted.returncode:  # root without the right to mount (an unprivileged container)
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        # The volume also holds a file that keeps growing (Milvus Lite's, an AOF): 1.5 MiB of the 4 left for a
        # 4 MiB budget. Before: a commit failed (EIO), the newest generation was deleted as corrupt, and the new
        # generation's sparse lock file was a SIGBUS on the full volume.
        filler = mount / "other.db"
        filler.write_bytes(b"x" * (1536 << 10))
        result = run_child(str(mount / "disk"), str(CAPACITY), "full-volume", str(filler))
        assert result["num_lost"] == 0  # nothing deleted as corrupt
        assert result["down"] is True and result["last_error"]  # /health lists the level as down, with why
        assert result["errors"] > 0  # its misses counted as the level's failures
        assert result["back"] is True and result["hits_after"] == 32  # room made: it takes writes and reads again
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# ---- the byte bound with an idle process ----------------------------------------------------------------------


def mapped_deleted_generations(pid: int) -> set[str]:
    """Files of dropped generations (unlinked) that process ``pid`` still maps: their space is not back."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[-2] for line in maps.splitlines() if "/gen-" in line and line.endswith("(deleted)")}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps (Linux)")
def test_an_idle_process_closes_the_generations_another_drops_and_lock_files_count(tmp_path):
    idle = subprocess.Popen([sys.executable, PROCESS, str(tmp_path), str(CAPACITY), "idle", "0", "64"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    assert idle.stdout is not None and idle.stdin is not None
    try:
        while (line := idle.stdout.readline()).strip() != "idle":  # its batches in, then no call of its own
            assert line, "the idle process ended"
        tier = open_tier(str(tmp_path), CAPACITY)
        try:
            write(tier, 64, 64 + 3 * CAPACITY // VALUE_BYTES)  # every generation the idle one mapped is dropped
            # Every file counts: data and lock files, the meta environment's.
            assert files_of(tmp_path) <= CAPACITY
        finally:
            tier.store.close()
        # Before: the idle process kept every dropped generation mapped until its next call (never).
        deadline = time.monotonic() + 60
        while mapped_deleted_generations(idle.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mapped_deleted_generations(idle.pid) == set()
    finally:
        idle.stdin.write("\n")
        idle.stdin.flush()
        idle.wait(timeout=60)
    assert idle.returncode == 0


def test_a_generation_another_process_is_writing_is_never_taken_for_a_short_one(tmp_path):
    # The length check reads the meta page, then the size: a commit landing between two reads in the other order
    # (size, then a meta page counting pages written after it) would drop a healthy generation.
    seeded = open_tier(str(tmp_path), CAPACITY)
    seeded.store.close()
    writer = subprocess.Popen([sys.executable, PROCESS, str(tmp_path), str(CAPACITY), "write", "0",
                               str(3 * CAPACITY // VALUE_BYTES)], stdout=subprocess.DEVNULL, env=ENV)
    store = DiskStore(tmp_path, capacity_bytes=CAPACITY, check_interval_s=None)
    try:
        num_checks = 0
        while writer.poll() is None or num_checks == 0:
            store.check()
            num_checks += 1
        assert writer.returncode == 0
        assert store.figures().num_lost == 0, f"a healthy generation dropped in {num_checks} checks"
    finally:
        store.close()
