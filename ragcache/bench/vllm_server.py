"""Start and stop a real vLLM OpenAI-compatible server (CPU build) for tests and benchmarks.

The server runs from its own virtual environment (``.venv-vllm``, see ``mk/vllm.mk``) with prefix
caching on, ``--enable-prompt-tokens-details`` (so responses report cached tokens), ``--enforce-eager``
(no graph capture: starts in ~30 s on CPU) and a fixed, small number of KV blocks so that eviction can
be caused on demand.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ragcache.processes import free_port, wait_healthy

__all__ = ["VLLMServerConfig", "VLLMServer"]


@dataclass(frozen=True)
class VLLMServerConfig:
    """How to run the server. ``num_blocks * block_size`` is the whole KV cache, in tokens."""

    python: Path
    model: Path
    served_model_name: str = "tiny-llama"
    port: int = 0
    block_size: int = 32  # the CPU backend needs a multiple of 32
    num_blocks: int = 128
    max_model_len: int = 2048
    # On CPU this is the fraction of RAM vLLM reserves; the tiny model needs very little.
    memory_utilization: float = 0.15
    startup_timeout_s: float = 240.0
    log_path: Path | None = None
    # Off only to measure what prefix caching is worth (``ragcache bench kv``).
    enable_prefix_caching: bool = True


class VLLMServer:
    """One vLLM server process; :meth:`start` blocks until ``/health`` answers."""

    def __init__(self, config: VLLMServerConfig) -> None:
        self.config = config
        self.port = config.port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        c = self.config
        return [
            str(c.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(c.model), "--served-model-name", c.served_model_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details", "--enforce-eager",
            "--block-size", str(c.block_size), "--num-gpu-blocks-override", str(c.num_blocks),
            "--max-model-len", str(c.max_model_len), "--dtype", "float32",
            "--gpu-memory-utilization", str(c.memory_utilization),
            "--disable-uvicorn-access-log",
        ]

    def start(self) -> None:
        """Launch the server and wait until it is healthy; raises RuntimeError (with the log tail) if not."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                   VLLM_DO_NOT_TRACK="1")
        log_path = self.config.log_path or Path(os.devnull)
        started = time.monotonic()
        with open(log_path, "ab") as log:
            # A new session so stop() can signal the API server and its engine-core children together.
            self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)
        try:
            wait_healthy(self._proc, f"{self.base_url}/health", name="vLLM", timeout_s=self.config.startup_timeout_s,
                         interval_s=0.5, log_tail=self._log_tail)
        except RuntimeError:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started

    def stop(self) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after 20 s)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def _log_tail(self, num_chars: int = 4000) -> str:
        path = self.config.log_path
        if path is None or not path.exists():
            return "(no log)"
        return path.read_text(errors="replace")[-num_chars:]

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
