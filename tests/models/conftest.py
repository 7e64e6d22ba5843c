"""Fixtures of the model tests, shared by tests/models and tests/models/remote (the encoder contract runs over
local, ONNX and remote encoders alike):

- ``infinity``: a real Infinity server (its own venv, built by `make infinity-env`, which `make test` depends
  on) serving the packaged all-MiniLM-L6-v2, started once per session on a free loopback port. Its python
  arrives in RAGCACHE_INFINITY_PYTHON (mk/infinity.mk exports it). Without it the tests that need Infinity
  skip, except under CI (CI=true), where they fail: CI must prove the provider path works.
- ``onnx_encoder`` / ``int8_encoder``: the packaged model on ONNX Runtime, float32 and int8, exported once
  per session into ``onnx_data_dir``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragcache_testing.infinity import InfinityServer, InfinityServerConfig, packaged_model_folder
from tests.conftest import in_ci


@pytest.fixture(scope="session")
def infinity(tmp_path_factory):
    python = os.environ.get("RAGCACHE_INFINITY_PYTHON")
    if not python or not Path(python).exists():
        message = "no Infinity environment: run `make infinity-env` (make test builds it and sets RAGCACHE_INFINITY_PYTHON)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    log_path = tmp_path_factory.mktemp("infinity") / "server.log"
    server = InfinityServer(InfinityServerConfig(python=Path(python), model=packaged_model_folder(), log_path=log_path))
    server.start()
    print(f"Infinity started in {server.startup_s:.1f}s on {server.base_url} (log: {log_path})")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def onnx_data_dir(tmp_path_factory):
    """A data_dir whose onnx/ folder the whole session shares: the model is exported once."""
    return tmp_path_factory.mktemp("onnx_data")


@pytest.fixture(scope="session")
def onnx_encoder(onnx_data_dir):
    from ragcache.models.onnx import OnnxEncoder

    return OnnxEncoder(backend="onnx", cache_dir=onnx_data_dir / "onnx")


@pytest.fixture(scope="session")
def int8_encoder(onnx_data_dir):
    from ragcache.models.onnx import OnnxEncoder

    return OnnxEncoder(backend="onnx-int8", cache_dir=onnx_data_dir / "onnx")
