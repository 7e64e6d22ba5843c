"""The data folder: private to the user who runs ragcache, and used by one ragcache at a time.

Private: the folder holds tenants' texts (the Redis append-only file, the disk level's ``data.mdb``, Milvus Lite's
``milvus.db``), so it is made 0700 and what ragcache writes in it 0600 (``PRIVATE_UMASK`` for the servers it
starts). An existing folder must be this user's and writable by nobody else, or it is refused in one line: a folder
another user can write is one where a file ragcache trusts can be swapped. One this user owns is set to 0700 (earlier
versions made it 0755 with 0644 files in it, and closing the folder covers those files too).

One at a time: ``hold_data_folder`` takes an exclusive ``flock`` on ``ragcache.lock`` in the folder, before any
server starts on its files, and writes the holder's pid and role in it. A second process that finds it held raises
``DataFolderInUseError`` naming that pid, having started nothing: two embedded Redis servers appending to one file,
or two Milvus Lite servers writing one database, is how acknowledged data is lost (and Milvus Lite's own failed open
deletes the live server's lock file). The kernel drops the lock when its process dies, ``kill -9`` included, so a
stale lock cannot block a restart. In one process the lock is counted, not taken twice: the service's app opens its
stores inside ``ragcache serve``, which holds it already.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from pathlib import Path

from ragcache.errors import ConfigError, DataFolderInUseError

__all__ = ["LOCK_FILE", "PRIVATE_UMASK", "DataFolderLock", "hold_data_folder", "secure_data_dir"]

LOCK_FILE = "ragcache.lock"
PRIVATE_UMASK = 0o077  # files 0600, folders 0700
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def secure_data_dir(path: Path) -> Path:
    """Create ``path`` (0700, parents as the umask makes them) or check an existing one: it must be a folder of this
    user that nobody else may write (``ConfigError`` in one line otherwise); a folder of this user open to others'
    reading is closed to 0700."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot create the data folder {path}: {exc.strerror}") from exc
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        info = os.stat(path)  # a link to a folder is fine; what it points to is checked
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"the data folder {path} is not a folder")
    if info.st_uid != os.geteuid():
        raise ConfigError(f"the data folder {path} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): "
                          "use a folder of your own (RAGCACHE_DATA_DIR)")
    if info.st_mode & _WRITABLE_BY_OTHERS:
        raise ConfigError(f"the data folder {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):04o}): "
                          f"chmod 700 {path}, or use another folder (RAGCACHE_DATA_DIR)")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


class DataFolderLock:
    """This process's hold on one data folder (``hold_data_folder``); ``release()`` once per hold."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd = fd
        self._num_holds = 1

    def release(self) -> None:
        with _held_lock:
            self._num_holds -= 1
            if self._num_holds > 0:
                return
            del _held[self.path]
        # Unlocked by closing; the file stays (removing it would let a third process lock a new file while a second
        # still holds the old one's descriptor).
        os.close(self._fd)

    def __enter__(self) -> DataFolderLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


_held: dict[Path, DataFolderLock] = {}
_held_lock = threading.Lock()


def hold_data_folder(data_dir: Path, *, role: str = "cache") -> DataFolderLock:
    """Make ``data_dir`` private (``secure_data_dir``) and take its lock; ``DataFolderInUseError`` when another process
    holds it. ``role`` is what a refused process is told the holder does ("serve": "a ragcache (pid N) already serves
    DIR")."""
    path = secure_data_dir(Path(data_dir)).resolve()
    with _held_lock:
        held = _held.get(path)
        if held is not None:
            held._num_holds += 1
            return held
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").split()
            os.close(fd)
            raise DataFolderInUseError(_in_use_message(Path(data_dir), holder)) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {role}\n".encode(), 0)
        lock = _held[path] = DataFolderLock(path, fd)
        return lock


def _in_use_message(data_dir: Path, holder: list[str]) -> str:
    pid = holder[0] if holder else "unknown"  # the holder may not have written its pid yet
    if holder[1:2] == ["serve"]:
        return f"a ragcache (pid {pid}) already serves {data_dir}: stop it, or use another folder (RAGCACHE_DATA_DIR)"
    return f"a ragcache process (pid {pid}) already uses the data folder {data_dir}: close it, or use another folder"
