"""Milvus Lite as a network server: the same ``http://host:port`` client path as Milvus standalone.

Milvus Lite opened from a ``.db`` path lives inside one process (a second process gets "Open local milvus
failed"). Started here as its own process listening on a loopback TCP port, one database serves many
clients and processes: service replicas sharing L3 and the knowledge base, or tests that stop and restart
it to see what an outage does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

from ragcache.errors import TierUnavailableError
from ragcache.storage.embedded_redis import free_port
from ragcache.storage.processes import ProcessExited, poll_until, stop_process

__all__ = ["MilvusLiteServer"]


def _milvus_lite_binary() -> Path:
    import milvus_lite

    return Path(milvus_lite.__file__).parent / "lib" / "milvus"


class MilvusLiteServer:
    """One ``milvus`` child process serving ``db_path`` on ``127.0.0.1:port``; ``url`` is what clients open.

    ``restart()`` starts it again on the same port and file, which is how the outage tests bring it back.
    """

    def __init__(self, db_path: str | Path, *, port: int | None = None, start: bool = True):
        self.db_path = Path(db_path).absolute()
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        if start:
            self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        binary = _milvus_lite_binary()
        env = dict(os.environ, LD_LIBRARY_PATH=f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        self.process = subprocess.Popen(
            [str(binary), str(self.db_path), f"127.0.0.1:{self.port}", "ERROR"],
            cwd=self.db_path.parent,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_listening(timeout_s)

    def _wait_listening(self, timeout_s: float) -> None:
        assert self.process is not None, "started before it is waited on"

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True

        try:
            if poll_until(listening, timeout_s=timeout_s, process=self.process, name="milvus-lite", not_yet=(OSError,)):
                return
        except ProcessExited as exc:
            error = self.process.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
            raise TierUnavailableError("L3", f"milvus-lite server exited: {error[-2000:]}") from exc
        self.stop()
        raise TierUnavailableError("L3", f"milvus-lite server did not listen on port {self.port}")

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
        if self.process is not None:
            self.resume()  # a paused process would not act on SIGTERM before the wait runs out
            stop_process(self.process)
            if self.process.stderr:
                self.process.stderr.close()
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> MilvusLiteServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
