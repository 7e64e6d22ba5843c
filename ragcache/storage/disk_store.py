"""The per-host disk store behind the disk level: generations of LMDB environments in one folder, rotated
oldest-out, shared by every process of the host.

Why generations: an LRU on disk pays a write for every hit (its recency), and a byte bound that is checked
after writing (LMCache's disk level grew to 460 GB against a 250 GB cap) does not hold under a write storm.
Here the folder holds at most ``num_generations`` LMDB environments, each with a map size of
``capacity_bytes / num_generations``: LMDB itself refuses a transaction that would grow a file past its map
(``MapFullError``), so no file can outgrow its share whatever the write rate. Writes go into the newest
generation; when it is full a new one is made and the oldest is dropped whole (its entries are the
evicted ones, counted). A hit costs one read transaction per generation asked, and no write.

Bytes on disk: at most ``capacity_bytes`` in the live generations, plus, for a moment, one dropped
generation that a process of the host still maps (its files are unlinked at once; the space comes back when
every process has closed it, which each does at its next call once no call of its own is still reading it):
``capacity_bytes`` + one generation at worst, as ``bench levels`` measures.

Processes: any number read without locks (LMDB readers); writes are serialised by LMDB's own writer lock,
and a rotation by ``flock`` on ``rotate.lock``. Which generations exist is announced through a small
``meta`` environment holding an epoch number that a rotation bumps: every call reads it (one read
transaction, about a microsecond) and a process that sees it moved lists the folder again.

Crashes: LMDB's copy-on-write pages mean a killed writer (``kill -9``) leaves the last committed
transaction intact; ``sync=False`` only gives up durability of the last transactions on a power loss,
which for a cache is a miss. A generation that cannot be opened or read (a corrupt file) is dropped and
counted (``num_lost``), and every value also carries the codec's checksum (``ragcache.tiers.codec``), so a
torn or altered value is a counted miss, never a wrong vector.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lmdb

from ragcache.errors import ConfigError

__all__ = ["DiskStore", "DiskStoreFigures"]

log = logging.getLogger(__name__)

_PREFIX = "gen-"
_EPOCH = b"epoch"
# Readers per environment across every process and thread of the host; a slot costs 64 bytes of lock file.
_MAX_READERS = 2048
# The smallest generation worth having: below it the B-tree's own pages are most of the file.
_MIN_GENERATION_BYTES = 1 << 20


@dataclass(frozen=True)
class DiskStoreFigures:
    """The store's figures: bytes in the live generations' files against the budget, how many generations,
    rotations and entries dropped with them (this process's count), and generations lost to corruption."""

    used_bytes: int
    capacity_bytes: int
    num_generations: int
    num_rotations: int
    num_evicted: int
    num_lost: int


@dataclass(frozen=True)
class _Generation:
    """One LMDB environment with two databases: ``blobs`` (one value per write batch: its values end to end,
    under an ascending batch number, appended, so pages fill whole) and ``index`` (key -> batch number, offset,
    length). Why not one value per key: LMDB fits two 1.5 KB values in a 4 KB page at best, and random keys
    split pages half-empty, so a 384-d float32 vector took ~4.5 KB on disk; a batch's blob takes its own size."""

    seq: int
    path: Path
    env: lmdb.Environment
    blobs: lmdb._Database
    index: lmdb._Database

    def num_entries(self) -> int:
        with self.env.begin() as txn:
            return int(txn.stat(self.index)["entries"])


class DiskStore:
    """Bytes by key in ``root``, bounded by ``capacity_bytes`` (see the module docstring). Thread-safe; one
    instance per process and folder (LMDB must not open one environment twice in a process)."""

    def __init__(self, root: str | Path, *, capacity_bytes: int, num_generations: int = 4):
        if num_generations < 2:
            raise ConfigError("the disk level needs at least 2 generations (one to write, one to drop)")
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self.num_generations = num_generations
        self.generation_bytes = capacity_bytes // num_generations
        if self.generation_bytes < _MIN_GENERATION_BYTES:
            raise ConfigError(f"disk_max_bytes {capacity_bytes} is too small for {num_generations} generations "
                              f"of at least {_MIN_GENERATION_BYTES} bytes")
        self.root.mkdir(parents=True, exist_ok=True)
        # The generation list and the counters change under it (and a rotation under the host's flock too).
        self._lock = threading.Lock()
        self._meta = lmdb.open(str(self.root / "meta"), map_size=1 << 20, max_dbs=0, sync=False)
        self._gens: tuple[_Generation, ...] = ()  # oldest first; replaced whole, so readers take it without the lock
        # Dropped generations stay open while a call that may have taken them is in flight: closing an environment
        # under another thread's read would free the map it reads from.
        self._retired: list[_Generation] = []
        self._flight_lock = threading.Lock()
        self._num_in_flight = 0
        self._max_seq = -1  # the largest generation number seen: new ones only ever count up
        self._epoch = -1
        self.num_rotations = self.num_evicted = self.num_lost = 0
        self._closed = False
        with self._rotation_lock():
            self._rescan()
            if not self._gens:
                self._add_generation()

    # ---- reads ----------------------------------------------------------------------------------------------

    def _enter(self) -> None:
        with self._flight_lock:
            self._num_in_flight += 1

    def _leave(self) -> None:
        with self._flight_lock:
            self._num_in_flight -= 1
            idle = self._num_in_flight == 0
        if idle and self._retired:
            self._close_retired()

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The stored value of each key (None: absent), the newest generation first."""
        self._enter()
        try:
            return self._get_many(keys)
        finally:
            self._leave()

    def _get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        gens = self._current()
        values: list[bytes | None] = [None] * len(keys)
        wanted = list(range(len(keys)))
        for gen in reversed(gens):
            if not wanted:
                break
            try:
                found = _read(gen, [keys[i] for i in wanted])
            except lmdb.Error as exc:
                self._lose(gen, exc)
                continue
            if found:
                rest = []
                for i in wanted:
                    value = found.get(keys[i])
                    if value is None:
                        rest.append(i)
                    else:
                        values[i] = value
                wanted = rest
        return values

    def delete(self, keys: Sequence[bytes]) -> None:
        """Remove ``keys`` from every generation (a corrupt value, so that it is not read and counted again)."""
        self._enter()
        try:
            for gen in self._current():
                try:
                    with gen.env.begin(write=True) as txn:
                        for key in keys:
                            txn.delete(key, db=gen.index)
                except lmdb.Error as exc:
                    self._lose(gen, exc)
        finally:
            self._leave()

    # ---- writes ---------------------------------------------------------------------------------------------

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Store ``items`` in the newest generation, one transaction; a full generation rotates first."""
        if not items:
            return
        self._enter()
        try:
            self._put_many(items)
        finally:
            self._leave()

    def _put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        for _ in range(self.num_generations + 1):
            gen = self._current()[-1]
            try:
                _write(gen, items)
                return
            except lmdb.MapFullError:
                if not self._rotate(gen):
                    break
            except lmdb.Error as exc:
                self._lose(gen, exc)
        # A batch larger than a whole generation: stored in halves (each fits, or is halved again).
        if len(items) > 1:
            middle = len(items) // 2
            self._put_many(items[:middle])
            self._put_many(items[middle:])
        else:
            log.warning("disk level: one value of %d bytes does not fit a generation of %d bytes", len(items[0][1]),
                        self.generation_bytes)

    def _rotate(self, full: _Generation) -> bool:
        """Make a new newest generation and drop the oldest beyond ``num_generations``; False when ``full``
        is a fresh generation already (the batch itself is too big for one)."""
        with self._rotation_lock():
            self._rescan()
            if self._gens[-1].seq != full.seq:
                return True  # another thread or process rotated meanwhile: write into its new generation
            if full.num_entries() == 0:
                return False
            self._add_generation()
            return True

    # ---- generations ----------------------------------------------------------------------------------------

    def _current(self) -> tuple[_Generation, ...]:
        """The live generations, listed again when another process rotated (its epoch moved)."""
        with self._meta.begin() as txn:
            raw = txn.get(_EPOCH)
        epoch = int(raw) if raw is not None else 0
        if epoch != self._epoch:
            with self._lock:
                if epoch != self._epoch:
                    self._rescan()
        return self._gens

    def _rescan(self) -> None:
        """Open the generations on disk that are not open here, retire those gone (caller holds a lock)."""
        with self._meta.begin() as txn:
            raw = txn.get(_EPOCH)
        self._epoch = int(raw) if raw is not None else 0
        open_now = {gen.seq: gen for gen in self._gens}
        on_disk = sorted(int(path.name[len(_PREFIX):]) for path in self.root.glob(f"{_PREFIX}*") if path.name[len(_PREFIX):].isdigit())
        gens = []
        for seq in on_disk:
            gen = open_now.pop(seq, None) or self._open(seq, create=False)
            if gen is not None:
                gens.append(gen)
        self._max_seq = max([self._max_seq, *on_disk])
        self._gens = tuple(gens)
        self._retire(list(open_now.values()))

    def _open(self, seq: int, *, create: bool) -> _Generation | None:
        path = self.root / f"{_PREFIX}{seq:012d}"
        try:
            env = lmdb.open(str(path), map_size=self.generation_bytes, max_dbs=2, max_readers=_MAX_READERS, sync=False,
                            metasync=False, readahead=False, meminit=False, create=create)
            blobs, index = env.open_db(b"blobs"), env.open_db(b"index")
        except lmdb.Error as exc:
            if not create and not (path / "data.mdb").exists():
                return None  # being made by another process right now: the next epoch lists it
            log.warning("disk level: generation %s cannot be opened, dropped: %s", path.name, exc)
            self.num_lost += 1
            shutil.rmtree(path, ignore_errors=True)
            return None
        return _Generation(seq, path, env, blobs, index)

    def _add_generation(self) -> None:
        """A new newest generation, then the oldest dropped beyond the count (caller holds the rotation lock)."""
        # Sequence numbers only grow: a cleared folder's new generation never takes a name still mapped somewhere.
        seq = self._max_seq = self._max_seq + 1
        made = self._open(seq, create=True)
        assert made is not None, "creating a generation either succeeds or raises"
        gens = [*self._gens, made]
        dropped = gens[: max(0, len(gens) - self.num_generations)]
        for gen in dropped:
            try:
                evicted = gen.num_entries()
            except lmdb.Error:
                evicted = 0
            self.num_evicted += evicted
            shutil.rmtree(gen.path, ignore_errors=True)
        self._gens = tuple(gens[len(dropped):])
        self._retire(dropped)
        if len(gens) > 1:
            self.num_rotations += 1
        with self._meta.begin(write=True) as txn:
            self._epoch += 1
            txn.put(_EPOCH, str(self._epoch).encode())

    def _retire(self, gens: list[_Generation]) -> None:
        """Close ``gens`` (no longer in ``self._gens``) once no call that may have taken them is in flight."""
        with self._flight_lock:
            self._retired.extend(gens)
        self._close_retired()

    def _close_retired(self) -> None:
        with self._flight_lock:
            if self._num_in_flight:
                return  # the last call to leave closes them
            retired, self._retired = self._retired, []
        for gen in retired:
            gen.env.close()

    def _lose(self, gen: _Generation, exc: Exception) -> None:
        """A generation whose file fails to read: dropped from the host, counted; its keys become misses."""
        log.warning("disk level: generation %s is unreadable, dropped: %s", gen.path.name, exc)
        with self._rotation_lock():
            self._rescan()
            if any(live.seq == gen.seq for live in self._gens):
                shutil.rmtree(gen.path, ignore_errors=True)
                self.num_lost += 1
                self._rescan()
                if not self._gens:
                    self._add_generation()
                with self._meta.begin(write=True) as txn:
                    self._epoch += 1
                    txn.put(_EPOCH, str(self._epoch).encode())

    def _rotation_lock(self):
        return _RotationLock(self._lock, self.root / "rotate.lock")

    def clear(self) -> None:
        """Drop every generation (the host's whole disk level) and start an empty one."""
        with self._rotation_lock():
            self._rescan()
            cleared, self._gens = list(self._gens), ()
            for gen in cleared:
                shutil.rmtree(gen.path, ignore_errors=True)
            self._retire(cleared)
            self._add_generation()

    # ---- figures --------------------------------------------------------------------------------------------

    def figures(self) -> DiskStoreFigures:
        gens = self._current()
        used = 0
        for gen in gens:
            try:
                used += (gen.path / "data.mdb").stat().st_size
            except OSError:
                pass
        return DiskStoreFigures(used, self.capacity_bytes, len(gens), self.num_rotations, self.num_evicted, self.num_lost)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for gen in [*self._gens, *self._retired]:
                gen.env.close()
            self._gens, self._retired = (), []
            self._meta.close()


_LOCATION = struct.Struct("<QII")  # batch number, offset, length of a value inside its batch's blob


def _write(gen: _Generation, items: Sequence[tuple[bytes, bytes]]) -> None:
    """One transaction: the batch's values as one blob under the next batch number, and each key's location."""
    with gen.env.begin(write=True) as txn:
        cursor = txn.cursor(db=gen.blobs)
        batch = int.from_bytes(cursor.key(), "big") + 1 if cursor.last() else 0
        locations, offset = [], 0
        for key, value in items:
            locations.append((key, _LOCATION.pack(batch, offset, len(value))))
            offset += len(value)
        txn.put(batch.to_bytes(8, "big"), b"".join(value for _, value in items), db=gen.blobs, append=True)
        txn.cursor(db=gen.index).putmulti(locations)


def _read(gen: _Generation, keys: list[bytes]) -> dict[bytes, bytes]:
    """The values of those ``keys`` the generation holds, in one read transaction. A location that points outside
    its blob (a damaged file) reads as an empty value: the codec counts it corrupt."""
    found: dict[bytes, bytes] = {}
    # Copies, not buffers: a blob is read once per batch it holds (tens of KB, one memcpy), and each value is then
    # a slice of it, cheaper in Python than a buffer per key turned into bytes.
    with gen.env.begin() as txn:
        located = txn.cursor(db=gen.index).getmulti(keys)
        if not located:
            return found
        blobs: dict[bytes, bytes | None] = {}
        unpack, size = _LOCATION.unpack_from, _LOCATION.size
        for key, raw in located:
            batch_key = raw[:8]
            blob = blobs.get(batch_key, b"")
            if blob == b"":
                blob = blobs[batch_key] = txn.get(int.from_bytes(batch_key, "little").to_bytes(8, "big"), db=gen.blobs)
            _, offset, length = unpack(raw) if len(raw) == size else (0, 0, -1)
            found[key] = blob[offset : offset + length] if blob is not None and 0 <= length and offset + length <= len(blob) else b""
    return found


class _RotationLock:
    """This process's lock, then the host's (``flock`` on a file in the folder): one rotation at a time."""

    def __init__(self, lock: threading.Lock, path: Path):
        self._lock, self._path = lock, path
        self._fd = -1

    def __enter__(self) -> _RotationLock:
        self._lock.acquire()
        try:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        finally:
            self._lock.release()
