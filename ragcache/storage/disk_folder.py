"""The disk store's folder (``ragcache.storage.disk_store``): which generations exist on the host, how a new newest
one is made and the oldest dropped, and how another process learns of it.

Which generations exist is announced through a small ``meta`` environment holding an epoch number that every change
bumps: a process that reads it moved lists the folder again. Sequence numbers only grow. A generation is made under
another name and renamed into place, so a process listing the folder never opens a half-made one. A generation that
cannot be read (a damaged file, or one shorter than its meta page says) is dropped from the host and counted.

Nothing here locks: the store calls it under its own lock, and changes under the host's rotation lock too.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import lmdb

from ragcache.storage.disk_files import Availability, allocate_lock_file
from ragcache.storage.disk_generation import Generation, Generations, ShortFileError

__all__ = ["DAMAGED", "META_MAP_BYTES", "META_READERS", "GenerationFolder"]

log = logging.getLogger(__name__)

_PREFIX = "gen-"
_EPOCH = b"epoch"
# The meta environment: one key, its pages reused on every bump (a few of its 64 pages are ever used).
META_MAP_BYTES = 256 << 10
META_READERS = 126  # LMDB's default
# Errors that say a generation's file is damaged: it is dropped and counted. Any other error of a write (EIO,
# ENOSPC from a full volume) says nothing of the file: the level is unavailable, and the generation kept.
DAMAGED = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError,
           lmdb.BadChecksumError, lmdb.IncompatibleError, lmdb.PanicError)


class GenerationFolder:
    """The live generations in ``root`` (oldest first, at most ``num_generations``), as this process last listed
    them, and this process's counts of rotations, entries evicted with a dropped generation and generations lost.
    Opening and closing go through ``envs`` (never under a read); a change that finds no room on the volume makes
    ``availability`` unavailable and changes nothing."""

    def __init__(self, root: Path, *, num_generations: int, generation_bytes: int, map_bytes: int,
                 availability: Availability, envs: Generations) -> None:
        self.root = root
        self.num_generations = num_generations
        self.generation_bytes = generation_bytes
        self.map_bytes = map_bytes
        self._availability = availability
        self._envs = envs
        allocate_lock_file(root / "meta", META_READERS, make_folder=True)
        self._meta = lmdb.open(str(root / "meta"), map_size=META_MAP_BYTES, max_dbs=0, max_readers=META_READERS,
                               sync=False, mode=0o600)
        # Replaced whole, so a reader takes the tuple without a lock.
        self.live: tuple[Generation, ...] = ()
        self._max_seq = -1  # the largest generation number seen: new ones only ever count up
        self._epoch = -1
        self.num_rotations = self.num_evicted = self.num_lost = 0

    def moved(self) -> bool:
        """Whether another process changed the generations since this one last listed them (one read transaction,
        about a microsecond)."""
        return self._read_epoch() != self._epoch

    def _read_epoch(self) -> int:
        with self._meta.begin() as txn:
            raw = txn.get(_EPOCH)
        return int(raw) if raw is not None else 0

    def rescan(self) -> None:
        """Open the generations on disk that are not open here, retire those gone and drop those whose file is
        shorter than its meta page says."""
        self._epoch = self._read_epoch()
        open_now = {gen.seq: gen for gen in self.live}
        on_disk = sorted(int(path.name[len(_PREFIX):]) for path in self.root.glob(f"{_PREFIX}*")
                         if path.name[len(_PREFIX):].isdigit())
        gens = []
        for seq in on_disk:
            gen = open_now.pop(seq, None)
            if gen is not None and _cut_short(gen):
                self.drop_lost(gen.path, f"data.mdb is {gen.missing_bytes()} bytes shorter than its meta page says")
                open_now[seq] = gen  # retired below
                continue
            gen = gen or self._open(seq)
            if gen is not None:
                gens.append(gen)
        self._max_seq = max([self._max_seq, *on_disk])
        self.live = tuple(gens)
        self._envs.retire(list(open_now.values()))

    def _open(self, seq: int) -> Generation | None:
        """An existing generation, or None: dropped and counted when it cannot be read (a short or damaged file)."""
        path = self.root / f"{_PREFIX}{seq:012d}"
        try:
            return self._envs.open(seq, path, map_bytes=self.map_bytes)
        except FileNotFoundError:
            pass  # removed since the folder was listed
        except (ShortFileError, *DAMAGED) as exc:
            self.drop_lost(path, str(exc))
        except (OSError, lmdb.Error) as exc:  # no room for its lock file, an I/O error: the generation is kept
            self._availability.set_unavailable(f"generation {path.name} cannot be opened: {exc}")
        return None

    def drop_lost(self, path: Path, reason: str) -> None:
        """Remove a generation that cannot be read from the host, counted (its keys become misses)."""
        log.warning("disk level: generation %s cannot be read, dropped: %s", path.name, reason)
        self.num_lost += 1
        shutil.rmtree(path, ignore_errors=True)

    def add(self) -> None:
        """A new newest generation, then the oldest dropped beyond the count; when the volume has no room for one
        beyond the margin, nothing changes and the level becomes unavailable."""
        if not self._availability.room_for(self.generation_bytes - self.map_bytes):
            return
        # Sequence numbers only grow: a cleared folder's new generation never takes a name still mapped somewhere.
        seq = self._max_seq + 1
        path = self.root / f"{_PREFIX}{seq:012d}"
        # Made under another name and renamed into place: a process listing the folder meanwhile never opens a
        # half-made generation (LMDB would make its files itself, the lock file sparse).
        making = self.root / f".new-{seq:012d}"
        shutil.rmtree(making, ignore_errors=True)
        try:
            making.mkdir()
            made = self._envs.open(seq, making, map_bytes=self.map_bytes)
        except (OSError, lmdb.Error, ShortFileError) as exc:
            shutil.rmtree(making, ignore_errors=True)
            self._availability.set_unavailable(f"a new generation cannot be made: {exc}")
            return
        os.rename(making, path)
        made = Generation(seq, path, made.env, made.blobs, made.index, made.page_bytes)
        self._max_seq = seq
        gens = [*self.live, made]
        dropped = gens[: max(0, len(gens) - self.num_generations)]
        for gen in dropped:
            try:
                evicted = gen.num_entries()
            except lmdb.Error:
                evicted = 0
            self.num_evicted += evicted
            shutil.rmtree(gen.path, ignore_errors=True)
        self.live = tuple(gens[len(dropped):])
        self._envs.retire(dropped)
        if len(gens) > 1:
            self.num_rotations += 1
        self.bump_epoch()

    def bump_epoch(self) -> None:
        """Tell the host's other processes that the generations changed."""
        try:
            with self._meta.begin(write=True) as txn:
                txn.put(_EPOCH, str(self._epoch + 1).encode())
        except lmdb.Error as exc:  # a full volume: the others see the change at their next listing (the watch's)
            self._availability.set_unavailable(f"the epoch could not be written: {exc}")
            return
        self._epoch += 1

    def clear(self) -> None:
        """Drop every generation and make an empty one."""
        self.rescan()
        cleared, self.live = list(self.live), ()
        for gen in cleared:
            shutil.rmtree(gen.path, ignore_errors=True)
        self._envs.retire(cleared)
        self.add()

    def used_bytes(self) -> int:
        """Bytes of the folder's files as this process lists it: the meta environment's and each live generation's."""
        used = 0
        for folder in [self.root / "meta", *(gen.path for gen in self.live)]:
            for name in ("data.mdb", "lock.mdb"):
                try:
                    used += (folder / name).stat().st_size
                except OSError:
                    pass
        return used

    def close(self) -> None:
        """Close every generation this process has open, and the meta environment."""
        self._envs.close_all(self.live)
        self.live = ()
        self._meta.close()


def _cut_short(gen: Generation) -> bool:
    try:
        return gen.missing_bytes() > 0
    except FileNotFoundError:
        return False  # removed meanwhile: the next listing retires it
