"""The per-host disk store behind the disk level: generations of LMDB environments in one folder, rotated
oldest-out, shared by every process of the host.

Why generations: an LRU on disk pays a write for every hit (its recency), and a byte bound that is checked
after writing (LMCache's disk level grew to 460 GB against a 250 GB cap) does not hold under a write storm.
Here the folder holds at most ``num_generations`` LMDB environments, each with a map size of
``capacity_bytes / num_generations``: LMDB itself refuses a transaction that would grow a file past its map
(``MapFullError``), so no file can outgrow its share whatever the write rate. Writes go into the newest
generation; when it is full a new one is made and the oldest is dropped whole (its entries are the
evicted ones, counted). A hit costs one read transaction per generation asked, and no write.

Bytes on disk: every file counts (the data and lock files of each generation, the meta environment's): at most
``capacity_bytes`` in the live generations, plus, for a moment, one dropped generation that a process of the host
still maps (its files are unlinked at once; the space comes back when every process has closed it, which each does
once no call of its own still reads it: at its next call, or within ``check_interval_s`` when idle, by its watch
thread): ``capacity_bytes`` + one generation at worst, as ``bench levels`` measures.

Processes: any number read without locks (LMDB readers); writes are serialised by LMDB's own writer lock,
and a rotation by ``flock`` on ``rotate.lock``. Which generations exist, and how the others learn that a rotation
changed them, is the folder's business (``ragcache.storage.disk_folder``); every call asks it whether they moved.

Crashes: LMDB's copy-on-write pages mean a killed writer (``kill -9``) leaves the last committed
transaction intact; ``sync=False`` only gives up durability of the last transactions on a power loss,
which for a cache is a miss. A generation that cannot be opened or read (a damaged file, or one shorter than its
meta page says, checked before any page is read: ``ragcache.storage.disk_files``) is dropped and counted
(``num_lost``), and every value also carries the codec's checksum (``ragcache.tiers.codec``), so a torn or
altered value is a counted miss, never a wrong vector.

A full volume: LMDB maps its files, and a page the file system cannot back is a SIGBUS, not an error. Lock files
are allocated before they are mapped; free space is checked before a generation is made and every
``check_interval_s``; under ``min_free_bytes`` free, or after a write failed (EIO/ENOSPC: nothing is damaged, the
transaction was aborted), the level is unavailable (``TierUnavailableError``: misses, counted, the level down in
``/health``) until the space is back. Nothing is deleted for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import lmdb

from ragcache.errors import ConfigError, TierUnavailableError
from ragcache.storage.disk_files import Availability, RotationLock, Watch, free_bytes, lock_file_bytes
from ragcache.storage.disk_folder import DAMAGED, META_MAP_BYTES, META_READERS, GenerationFolder
from ragcache.storage.disk_generation import MAX_READERS, Generation, Generations, read_values, write_values

__all__ = ["DiskStore", "DiskStoreFigures"]

log = logging.getLogger(__name__)

# The smallest data file worth having: below it the B-tree's own pages are most of the file.
_MIN_GENERATION_BYTES = 512 << 10


@dataclass(frozen=True)
class DiskStoreFigures:
    """The store's figures: bytes of its files (lock files and meta included) against the budget, generations,
    rotations and entries dropped with them (this process's count), generations lost to damage, and why the level
    is unavailable now (None: it is not) with the calls refused while it was."""

    used_bytes: int
    capacity_bytes: int
    num_generations: int
    num_rotations: int
    num_evicted: int
    num_lost: int
    unavailable: str | None = None
    num_refused: int = 0


class DiskStore:
    """Bytes by key in ``root``, bounded by ``capacity_bytes`` (see the module docstring). Thread-safe; one
    instance per process and folder (LMDB must not open one environment twice in a process).

    ``min_free_bytes``: below this much free space on the volume the level is unavailable (every call raises
    ``TierUnavailableError``, a miss for the cache) until the space is back. ``check_interval_s``: how often a
    thread checks the free space, the epoch (so an idle process closes generations dropped elsewhere) and the
    generations' files; None: only when ``check`` is called. ``free_space``: the volume's free bytes (a test's fake).
    """

    def __init__(self, root: str | Path, *, capacity_bytes: int, num_generations: int = 4,
                 min_free_bytes: int = 64 << 20, check_interval_s: float | None = 1.0,
                 free_space: Callable[[Path], int] = free_bytes):
        if num_generations < 2:
            raise ConfigError("the disk level needs at least 2 generations (one to write, one to drop)")
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self.num_generations = num_generations
        self.min_free_bytes = min_free_bytes
        # Every file counts against the budget: the meta environment, and each generation's lock file beside its
        # data file, whose map (LMDB's own bound on it) is the rest of the generation's share.
        self.generation_bytes = (capacity_bytes - META_MAP_BYTES - lock_file_bytes(META_READERS)) // num_generations
        self.map_bytes = self.generation_bytes - lock_file_bytes(MAX_READERS)
        if self.map_bytes < _MIN_GENERATION_BYTES:
            raise ConfigError(f"disk_max_bytes {capacity_bytes} is too small for {num_generations} generations "
                              f"of at least {_MIN_GENERATION_BYTES + lock_file_bytes(MAX_READERS)} bytes")
        self.root.mkdir(parents=True, exist_ok=True)
        # The folder's generation list and counters change under it (and a rotation under the host's flock too).
        self._lock = threading.Lock()
        # Dropped generations stay open while a call that may have taken them is in flight (``Generations``).
        self._envs = Generations()
        self._availability = Availability(self.root, min_free_bytes, free_space)
        self._folder = GenerationFolder(self.root, num_generations=num_generations,
                                        generation_bytes=self.generation_bytes, map_bytes=self.map_bytes,
                                        availability=self._availability, envs=self._envs)
        self._closed = False
        with self._rotation_lock():
            self._folder.rescan()
            if not self._folder.live:
                self._folder.add()
        self._watch = Watch(self.check, check_interval_s) if check_interval_s is not None else None

    # ---- availability ---------------------------------------------------------------------------------------

    @property
    def unavailable(self) -> str | None:
        """Why the level refuses calls now (a full volume, a failed write), or None while it is available."""
        return self._availability.reason

    def check(self) -> None:
        """What the watch thread does each interval: the free space (the level unavailable under the margin,
        available again above it), the generations listed again (those dropped by another process closed here,
        though this one is idle) and their files checked against their meta pages (a short one dropped)."""
        self._envs.enter()
        try:
            with self._rotation_lock():
                if self._availability.room_for(0):
                    if not self._folder.live:
                        self._folder.add()
                    if self._folder.live:
                        self._availability.clear()
                self._folder.rescan()
        finally:
            self._envs.leave()

    # ---- reads ----------------------------------------------------------------------------------------------

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The stored value of each key (None: absent), the newest generation first. Raises
        ``TierUnavailableError`` while the level is unavailable."""
        self._availability.refuse_if_unavailable()
        self._envs.enter()
        try:
            return self._get_many(keys)
        finally:
            self._envs.leave()

    def _get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        gens = self._current()
        values: list[bytes | None] = [None] * len(keys)
        wanted = list(range(len(keys)))
        for gen in reversed(gens):
            if not wanted:
                break
            try:
                found = read_values(gen, [keys[i] for i in wanted])
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
        self._availability.refuse_if_unavailable()
        self._envs.enter()
        try:
            for gen in self._current():
                try:
                    with gen.env.begin(write=True) as txn:
                        for key in keys:
                            txn.delete(key, db=gen.index)
                except DAMAGED as exc:
                    self._lose(gen, exc)
                except lmdb.Error as exc:
                    self._availability.set_unavailable(f"a delete failed: {exc}")
                    raise TierUnavailableError("disk", str(exc)) from exc
        finally:
            self._envs.leave()

    # ---- writes ---------------------------------------------------------------------------------------------

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Store ``items`` in the newest generation, one transaction; a full generation rotates first. Raises
        ``TierUnavailableError`` while the level is unavailable, or when this write finds it so (a full volume)."""
        if not items:
            return
        self._availability.refuse_if_unavailable()
        self._envs.enter()
        try:
            self._put_many(items)
        finally:
            self._envs.leave()

    def _put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        for _ in range(self.num_generations + 1):
            gen = self._current()[-1]
            try:
                write_values(gen, items)
                return
            except lmdb.MapFullError:
                if not self._rotate(gen):
                    break
            except DAMAGED as exc:
                self._lose(gen, exc)
            except lmdb.Error as exc:
                # EIO/ENOSPC: the volume is full (or failing); the transaction was aborted and the file is whole.
                self._availability.set_unavailable(f"a write failed: {exc}")
                raise TierUnavailableError("disk", str(exc)) from exc
            self._availability.refuse_if_unavailable()  # a rotation found no room for a new generation
        # A batch larger than a whole generation: stored in halves (each fits, or is halved again).
        if len(items) > 1:
            middle = len(items) // 2
            self._put_many(items[:middle])
            self._put_many(items[middle:])
        else:
            log.warning("disk level: one value of %d bytes does not fit a generation of %d bytes", len(items[0][1]),
                        self.map_bytes)

    def _rotate(self, full: Generation) -> bool:
        """Make a new newest generation and drop the oldest beyond ``num_generations``; False when ``full``
        is a fresh generation already (the batch itself is too big for one)."""
        with self._rotation_lock():
            self._folder.rescan()
            live = self._folder.live
            if live and live[-1].seq != full.seq:
                return True  # another thread or process rotated meanwhile: write into its new generation
            if full.num_entries() == 0:
                return False
            self._folder.add()
            return True

    # ---- generations ----------------------------------------------------------------------------------------

    def _current(self) -> tuple[Generation, ...]:
        """The live generations, listed again when another process changed them."""
        if self._folder.moved():
            with self._lock:
                if self._folder.moved():
                    self._folder.rescan()
        live = self._folder.live
        if not live:  # none could be made (a full volume): the level is unavailable until one is
            self._availability.refuse_if_unavailable()
            raise TierUnavailableError("disk", "no generation")
        return live

    def _lose(self, gen: Generation, exc: Exception) -> None:
        """A generation whose file fails to read: dropped from the host, counted; its keys become misses."""
        with self._rotation_lock():
            self._folder.rescan()
            if any(live.seq == gen.seq for live in self._folder.live):
                self._folder.drop_lost(gen.path, str(exc))
                self._folder.rescan()
                if not self._folder.live:
                    self._folder.add()
                self._folder.bump_epoch()

    def _rotation_lock(self):
        return RotationLock(self._lock, self.root / "rotate.lock")

    def clear(self) -> None:
        """Drop every generation (the host's whole disk level) and start an empty one."""
        with self._rotation_lock():
            self._folder.clear()

    # ---- figures --------------------------------------------------------------------------------------------

    @property
    def num_rotations(self) -> int:
        return self._folder.num_rotations

    @property
    def num_evicted(self) -> int:
        return self._folder.num_evicted

    @property
    def num_lost(self) -> int:
        return self._folder.num_lost

    def figures(self) -> DiskStoreFigures:
        folder = self._folder
        return DiskStoreFigures(folder.used_bytes(), self.capacity_bytes, len(folder.live), folder.num_rotations,
                                folder.num_evicted, folder.num_lost, self.unavailable, self._availability.num_refused)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._folder.close()
