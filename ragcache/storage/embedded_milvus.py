"""Milvus Lite as a server of many processes: on a loopback TCP port (the same ``http://host:port`` client path as
Milvus standalone), or on a unix socket in a private folder.

Milvus Lite opened from a ``.db`` path lives inside one process (a second process gets "Open local milvus
failed"). Started here as its own process, one database serves many clients and processes: the workers of
``ragcache serve --workers N``, service replicas sharing L3 and the knowledge base, or tests that stop and restart
it to see what an outage does.

Milvus Lite has no authentication: whoever can connect reads and drops every collection. A TCP port on loopback is
open to every local user; ``unix_socket=True`` listens on a socket in a folder of its own (mode 0700: only this user
can connect), which is what ``ragcache serve --workers N`` uses, as the embedded Redis does.

The server never outlives this process: like pymilvus' own Milvus Lite, this process holds a lock on
``.<name>.lock`` beside the database and the ``milvus`` binary, given that path, exits as soon as the lock is free,
which the kernel does when this process dies, ``kill -9`` included. The same lock keeps any other process from
opening the database while this server runs.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ragcache.errors import TierUnavailableError
from ragcache.storage.data_folder import PRIVATE_UMASK
from ragcache.storage.processes import ProcessExited, free_port, poll_until, stop_process
from ragcache.storage.supervision import Supervisor

__all__ = ["MilvusLiteServer"]


def _milvus_lite_binary() -> Path:
    import milvus_lite

    return Path(milvus_lite.__file__).parent / "lib" / "milvus"


class MilvusLiteServer:
    """One ``milvus`` child process serving ``db_path`` on ``127.0.0.1:port``, or with ``unix_socket`` on a socket in
    a 0700 folder; ``url`` is what clients open.

    ``restart()`` starts it again on the same address and file, which is how the outage tests bring it back;
    ``supervise`` does it by itself when the process dies (``ragcache.storage.supervision``).
    """

    def __init__(self, db_path: str | Path, *, port: int | None = None, start: bool = True, unix_socket: bool = False,
                 supervise: bool = False, on_restart: Callable[[int], None] | None = None):
        self.db_path = Path(db_path).absolute()
        self.db_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Short (a unix socket path has at most 107 bytes), and mkdtemp's 0700 is what keeps other users out.
        self._socket_dir = tempfile.TemporaryDirectory(prefix="rc-milvus-") if unix_socket else None
        self.socket_path = Path(self._socket_dir.name) / "milvus.sock" if self._socket_dir else None
        self.port = 0 if unix_socket else port or free_port()
        self.process: subprocess.Popen | None = None
        self._lock_file: IO[bytes] | None = None
        self._supervisor: Supervisor | None = None
        if start:
            self.start()
        if supervise:
            self._supervisor = Supervisor("milvus-lite", lambda: self.process, self._launch, on_restart=on_restart)

    @property
    def url(self) -> str:
        if self.socket_path is not None:
            return f"unix:{self.socket_path}"
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """The ``milvus`` binary's listen argument."""
        return f"unix:{self.socket_path}" if self.socket_path is not None else f"127.0.0.1:{self.port}"

    @property
    def num_restarts(self) -> int:
        """Times the supervisor started this server again after it died (0 without ``supervise``)."""
        return self._supervisor.num_restarts if self._supervisor is not None else 0

    def start(self, timeout_s: float = 30.0) -> None:
        self._hold_lock()
        self._launch(timeout_s)

    def _hold_lock(self) -> None:
        if self._lock_file is not None:
            return
        lock_path = self.db_path.parent / f".{self.db_path.name}.lock"  # milvus_lite's own name for it
        lock_file = open(lock_path, "ab")  # noqa: SIM115 - held open for the server's life
        try:
            fcntl.lockf(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock_file.close()
            raise TierUnavailableError("L3", f"{self.db_path} is open in another process") from exc
        self._lock_file = lock_file

    def _launch(self, timeout_s: float = 30.0) -> None:
        """Start the ``milvus`` process on this object's file and address, and wait until it answers."""
        assert self._lock_file is not None, "the lock is held before a server starts"
        binary = _milvus_lite_binary()
        env = dict(os.environ, LD_LIBRARY_PATH=f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)  # a killed server's socket: waiting for it must wait for the new one
        self.process = subprocess.Popen(
            [str(binary), str(self.db_path), self.address, "ERROR", self._lock_file.name],
            cwd=self.db_path.parent,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            umask=PRIVATE_UMASK,  # the database holds tenants' documents: 0600
        )
        self._wait_listening(timeout_s)

    def _wait_listening(self, timeout_s: float) -> None:
        assert self.process is not None, "started before it is waited on"

        def listening() -> bool:
            if self.socket_path is not None:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.settimeout(0.2)
                    sock.connect(str(self.socket_path))
                    return True
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True

        try:
            if poll_until(listening, timeout_s=timeout_s, process=self.process, name="milvus-lite", not_yet=(OSError,)):
                return
        except ProcessExited as exc:
            error = self.process.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
            raise TierUnavailableError("L3", f"milvus-lite server exited: {error[-2000:]}") from exc
        stop_process(self.process)
        raise TierUnavailableError("L3", f"milvus-lite server did not listen at {self.url}")

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its port and accepts connections but answers nothing, as a hung
        Milvus does (the fault a stopped process cannot show: refusals come at once, silence never ends)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: a paused server answers again."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server and give its lock back (then ``start()`` may start it again)."""
        if self._supervisor is not None:
            supervisor, self._supervisor = self._supervisor, None
            supervisor.stop_and(self._stop_process)
        else:
            self._stop_process()
        if self._lock_file is not None:
            self._lock_file.close()  # closing it releases the lock
            self._lock_file = None

    def _stop_process(self) -> None:
        if self.process is not None:
            self.resume()  # a paused process would not act on SIGTERM before the wait runs out
            stop_process(self.process)
            if self.process.stderr:
                self.process.stderr.close()
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """``stop()``, and the socket's folder removed: for good."""
        self.stop()
        if self._socket_dir is not None:
            self._socket_dir.cleanup()
            self._socket_dir = None

    def __enter__(self) -> MilvusLiteServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
