"""The disk store's files, made safe to map: LMDB maps its files, so a page it touches that the file system cannot
back is a SIGBUS that kills the process, not an error (py-lmdb cannot turn it into one). Two such pages:

- the lock file: LMDB sizes a new one with ``ftruncate`` (sparse) and writes its reader table through a shared
  mapping; on a full volume the first write to an unbacked page kills the process. ``allocate_lock_file`` makes
  the file with ``posix_fallocate`` first, so every page exists before LMDB maps it (a full volume is then an
  ``OSError`` here, before anything is mapped);
- a data file shorter than its meta page says (cut short by a crash of the file system, a copy, a full volume
  outside LMDB's writes): LMDB trusts the meta page and reads pages past the end. ``missing_bytes`` compares the
  file's size with ``(last_pgno + 1) * page size`` before anything reads a page beyond the two meta pages.

Data pages are written with ``pwrite`` (no ``writemap``), so a full volume while committing is an error LMDB
returns (EIO or ENOSPC), never a signal.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import lmdb

from ragcache.errors import TierUnavailableError

__all__ = ["Availability", "RotationLock", "Watch", "allocate_lock_file", "free_bytes", "lock_file_bytes", "missing_bytes"]

log = logging.getLogger("ragcache.storage.disk_store")

# LMDB's reader table entry (MDB_reader, one cache line) and room for its header (MDB_txninfo: 192 bytes on
# x86-64 glibc, 256 on aarch64). A lock file larger than LMDB asks for is used whole (more reader slots); never
# smaller, or LMDB would ``ftruncate`` the rest, sparse again.
_READER_BYTES = 64
_HEADER_ROOM = 1024


def lock_file_bytes(max_readers: int) -> int:
    """The size of the lock file made for an environment of ``max_readers`` (what it costs on disk)."""
    return max_readers * _READER_BYTES + _HEADER_ROOM


def allocate_lock_file(folder: Path, max_readers: int, *, make_folder: bool = False) -> None:
    """Make ``folder/lock.mdb`` with every page allocated before LMDB maps it; an existing one (another process
    may have it mapped) keeps its size and has its holes allocated. Raises ``OSError`` (ENOSPC) on a full volume."""
    if make_folder:
        folder.mkdir(exist_ok=True)
    fd = os.open(folder / "lock.mdb", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        # Never grow a lock file another process maps: its reader count comes from the size it saw.
        os.posix_fallocate(fd, 0, size if size else lock_file_bytes(max_readers))
    finally:
        os.close(fd)


def missing_bytes(data_file: Path, env: lmdb.Environment, page_bytes: int) -> int:
    """How many bytes ``data_file`` lacks against what its meta page says it holds (0: whole). The size is read
    before the meta page (a file shorter than two pages would fault on the meta read itself) and again after it:
    a writer of another process writes its pages before the meta page that counts them, and a file only grows,
    so a size read after the meta page can never be short of it by a commit that landed in between."""
    size = data_file.stat().st_size
    if size < 2 * page_bytes:
        return 2 * page_bytes - size
    last_pgno = env.info()["last_pgno"]
    return max(0, (last_pgno + 1) * page_bytes - data_file.stat().st_size)


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still take on ``folder``'s volume (``f_bavail``: root's reserve excluded)."""
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


class Availability:
    """Whether the disk level takes calls. Unavailable (every call a ``TierUnavailableError``: a miss for the
    cache, counted, and the level down in ``/health``) while the volume's free space is under the margin or after
    a write failed for want of it; the store's watch clears it once the space is back."""

    def __init__(self, folder: Path, min_free_bytes: int, free_space: Callable[[Path], int]):
        self._folder, self._free_space = folder, free_space
        self.min_free_bytes = min_free_bytes
        self.reason: str | None = None  # None: available
        self.num_refused = 0  # calls refused while unavailable (this process)
        self._lock = threading.Lock()

    def refuse_if_unavailable(self) -> None:
        reason = self.reason
        if reason is not None:
            with self._lock:
                self.num_refused += 1
            raise TierUnavailableError("disk", reason)

    def set_unavailable(self, reason: str) -> None:
        if self.reason is None:
            log.warning("disk level unavailable (its calls are misses until this clears): %s", reason)
        self.reason = reason

    def clear(self) -> None:
        if self.reason is not None:
            log.warning("disk level available again: %d bytes free", self._free_space(self._folder))
            self.reason = None

    def room_for(self, need: int) -> bool:
        """Whether the volume has ``need`` bytes beyond the margin; if not, the level becomes unavailable."""
        free = self._free_space(self._folder)
        if free >= self.min_free_bytes + need:
            return True
        self.set_unavailable(f"{free} bytes free on the volume of {self._folder}, under the margin of "
                             f"{self.min_free_bytes}" + (f" and a new generation's {need}" if need else ""))
        return False


class RotationLock:
    """This process's lock, then the host's (``flock`` on a file in the folder): one rotation at a time."""

    def __init__(self, lock: threading.Lock, path: Path):
        self._lock, self._path = lock, path
        self._fd = -1

    def __enter__(self) -> RotationLock:
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


class Watch:
    """A daemon thread that calls ``check`` every ``interval_s`` until stopped; a failed check is logged and the
    next one runs (the watch must outlive one bad interval)."""

    def __init__(self, check: Callable[[], None], interval_s: float):
        self._check, self._interval_s = check, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ragcache-disk-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._check()
            except Exception:  # noqa: BLE001
                log.exception("disk level: the periodic check failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
