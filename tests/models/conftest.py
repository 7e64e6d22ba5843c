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

import pytest

from ragcache_testing.infinity import packaged_model_folder
from tests.conftest import running_infinity


@pytest.fixture(scope="session")
def infinity(tmp_path_factory):
    log_folder = tmp_path_factory.mktemp("infinity")
    with running_infinity(packaged_model_folder(), log_folder) as server:
        print(f"Infinity started in {server.startup_s:.1f}s on {server.base_url} (log: {log_folder / 'server.log'})")
        yield server


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
