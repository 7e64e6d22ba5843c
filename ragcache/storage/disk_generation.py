"""One generation of the disk store: an LMDB environment of two databases, opened only once its files are safe to
map (``ragcache.storage.disk_files``), and the one-transaction reads and writes of a batch."""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lmdb

from ragcache.storage.disk_files import allocate_lock_file, missing_bytes

__all__ = ["Generation", "Generations", "ShortFileError", "open_generation", "read_values", "write_values"]

# Readers per environment across every process and thread of the host; a slot costs 64 bytes of lock file.
MAX_READERS = 2048


class ShortFileError(Exception):
    """A generation's data file is shorter than its meta page says: reading it would fault (SIGBUS)."""


@dataclass(frozen=True)
class Generation:
    """One LMDB environment with two databases: ``blobs`` (one value per write batch: its values end to end,
    under an ascending batch number, appended, so pages fill whole) and ``index`` (key -> batch number, offset,
    length). Why not one value per key: LMDB fits two 1.5 KB values in a 4 KB page at best, and random keys
    split pages half-empty, so a 384-d float32 vector took ~4.5 KB on disk; a batch's blob takes its own size."""

    seq: int
    path: Path
    env: lmdb.Environment
    blobs: lmdb._Database
    index: lmdb._Database
    page_bytes: int

    def num_entries(self) -> int:
        with self.env.begin() as txn:
            return int(txn.stat(self.index)["entries"])

    def missing_bytes(self) -> int:
        """Bytes the data file lacks against its meta page (0: whole); see ``disk_files.missing_bytes``."""
        return missing_bytes(self.path / "data.mdb", self.env, self.page_bytes)


def open_generation(seq: int, path: Path, *, map_bytes: int) -> Generation:
    """Open (or, in an empty folder, make) the environment at ``path``: its lock file allocated before LMDB maps
    it, its data file's length checked against the meta page before any page past the meta pages is read.
    Raises ``OSError`` (no room for the lock file), ``lmdb.Error`` or ``ShortFileError``."""
    allocate_lock_file(path, MAX_READERS)
    env = lmdb.open(str(path), map_size=map_bytes, max_dbs=2, max_readers=MAX_READERS, sync=False, metasync=False,
                    readahead=False, meminit=False, create=False, mode=0o600)
    try:
        # Opening read the two meta pages (pread) and mapped the file; nothing has read a tree page yet.
        page_bytes = int(env.stat()["psize"])
        missing = missing_bytes(path / "data.mdb", env, page_bytes)
        if missing:
            raise ShortFileError(f"data.mdb lacks {missing} bytes its meta page says it holds")
        blobs, index = env.open_db(b"blobs"), env.open_db(b"index")
    except BaseException:
        env.close()
        raise
    return Generation(seq, path, env, blobs, index, page_bytes)


class Generations:
    """Opens and closes a store's environments so that none is closed under a read: a dropped generation stays
    open while a call that may have taken it is in flight (closing an environment under another thread's read
    would free the map it reads from), and the last call to leave closes it.

    No environment is opened while another thread closes one. py-lmdb refuses to open files that an open
    environment of the process holds, known by (st_dev, st_ino), and forgets a closed environment's only after
    mdb_env_close returns, which runs without the GIL; a dropped generation's files are unlinked already, so their
    inodes are free once closed and a new generation's lock file made meanwhile may get one of them: refused as
    "already open in this process". Its locks are taken after the store's own where both are held."""

    def __init__(self) -> None:
        self._flight_lock = threading.Lock()
        self._num_in_flight = 0
        self._retired: list[Generation] = []
        self._env_lock = threading.Lock()

    @property
    def retired(self) -> tuple[Generation, ...]:
        """Dropped generations still open, waiting for the calls in flight to leave."""
        return tuple(self._retired)

    def open(self, seq: int, path: Path, *, map_bytes: int) -> Generation:
        """``open_generation``, never beside a close."""
        with self._env_lock:
            return open_generation(seq, path, map_bytes=map_bytes)

    def enter(self) -> None:
        """A call that may take generations begins."""
        with self._flight_lock:
            self._num_in_flight += 1

    def leave(self) -> None:
        """That call ended: the last to leave closes what was retired meanwhile."""
        with self._flight_lock:
            self._num_in_flight -= 1
            idle = self._num_in_flight == 0
        if idle and self._retired:
            self._close_retired()

    def retire(self, gens: list[Generation]) -> None:
        """Close ``gens`` (no longer listed by the store) once no call that may have taken them is in flight."""
        with self._flight_lock:
            self._retired.extend(gens)
        self._close_retired()

    def _close_retired(self) -> None:
        with self._flight_lock:
            if self._num_in_flight:
                return  # the last call to leave closes them
            retired, self._retired = self._retired, []
        self._close(retired)

    def close_all(self, live: tuple[Generation, ...]) -> None:
        """Close ``live`` and every retired generation: the store closes."""
        with self._flight_lock:
            retired, self._retired = self._retired, []
        self._close([*live, *retired])

    def _close(self, gens: list[Generation]) -> None:
        with self._env_lock:
            for gen in gens:
                gen.env.close()


_LOCATION = struct.Struct("<QII")  # batch number, offset, length of a value inside its batch's blob


def write_values(gen: Generation, items: Sequence[tuple[bytes, bytes]]) -> None:
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


def read_values(gen: Generation, keys: list[bytes]) -> dict[bytes, bytes]:
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
