"""Start and stop a real vLLM OpenAI-compatible server (CPU build) for tests and benchmarks.

The server runs from its own virtual environment (``.venv-vllm``, see ``mk/vllm.mk``) with prefix
caching on, ``--enable-prompt-tokens-details`` (so responses report cached tokens), ``--enforce-eager``
(no graph capture: starts in ~30 s on CPU) and a fixed, small number of KV blocks so that eviction can
be caused on demand.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from ragcache.storage.processes import HttpServerProcess

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
    # "priority" serves a request with a smaller ``priority`` value first (the registry's warms carry a large one).
    scheduling_policy: str = "fcfs"
    # Requests running at once (None: vLLM's default); 1 makes every other request wait in the queue.
    max_num_seqs: int | None = None
    # KV events (--kv-events-config): the PUB and replay ports on 127.0.0.1, or (kv_events_dir) two ipc:// sockets in
    # a folder only this user can enter, which nobody else can bind (docs/kv-events.md); None: no events.
    kv_events_port: int | None = None
    kv_replay_port: int | None = None
    kv_events_dir: Path | None = None

    @property
    def kv_events_endpoint(self) -> str | None:
        if self.kv_events_dir is not None:
            return f"ipc://{self.kv_events_dir}/events.sock"
        return None if self.kv_events_port is None else f"tcp://127.0.0.1:{self.kv_events_port}"

    @property
    def kv_replay_endpoint(self) -> str | None:
        if self.kv_events_dir is not None:
            return f"ipc://{self.kv_events_dir}/replay.sock"
        return None if self.kv_replay_port is None else f"tcp://127.0.0.1:{self.kv_replay_port}"


class VLLMServer(HttpServerProcess):
    """One vLLM server process; :meth:`start` blocks until ``/health`` answers."""

    name = "vLLM"
    extra_env = {"VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}
    own_process_group = True  # the API server and its engine-core children are stopped together
    health_interval_s = 0.5
    stop_timeout_s = 20.0

    def __init__(self, config: VLLMServerConfig) -> None:
        super().__init__(port=config.port, startup_timeout_s=config.startup_timeout_s, log_path=config.log_path)
        self.config = config

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
            "--disable-uvicorn-access-log", "--scheduling-policy", c.scheduling_policy,
            *(["--max-num-seqs", str(c.max_num_seqs)] if c.max_num_seqs is not None else []),
            *(["--kv-events-config", self._kv_events_config()] if c.kv_events_endpoint is not None else []),
        ]

    def _kv_events_config(self) -> str:
        c = self.config
        if c.kv_events_dir is not None:  # vLLM binds ipc:// addresses (its publisher connects only to tcp:// hosts)
            events = {"endpoint": c.kv_events_endpoint, "replay_endpoint": c.kv_replay_endpoint}
        else:
            events = {"endpoint": f"tcp://*:{c.kv_events_port}"}
            if c.kv_replay_port is not None:
                events["replay_endpoint"] = f"tcp://*:{c.kv_replay_port}"
        return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", **events})

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the server's whole process group (API server and engine core): SIGSTOP freezes it (its
        sockets still accept, nothing answers), SIGCONT thaws it, SIGKILL kills it without a word."""
        if self._proc is None:
            raise RuntimeError("vLLM is not running")
        os.killpg(self._proc.pid, signum)
        if signum == signal.SIGKILL:
            self._proc.wait(timeout=30)
            self._proc = None
