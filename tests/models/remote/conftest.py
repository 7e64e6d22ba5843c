"""Fixtures of the provider tests: a real Infinity server (its own venv, built by `make infinity-env`, which
`make test` depends on), started once per session on a free loopback port.

Its python arrives in RAGCACHE_INFINITY_PYTHON (mk/infinity.mk exports it). Without it the tests that need
Infinity skip, except under CI (CI=true), where they fail: CI must prove the provider path works.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragcache_testing.infinity import InfinityServer, InfinityServerConfig, packaged_model_folder


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def infinity(tmp_path_factory):
    python = os.environ.get("RAGCACHE_INFINITY_PYTHON")
    if not python or not Path(python).exists():
        message = "no Infinity environment: run `make infinity-env` (make test builds it and sets RAGCACHE_INFINITY_PYTHON)"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    log_path = tmp_path_factory.mktemp("infinity") / "server.log"
    server = InfinityServer(InfinityServerConfig(python=Path(python), model=packaged_model_folder(), log_path=log_path))
    server.start()
    print(f"Infinity started in {server.startup_s:.1f}s on {server.base_url} (log: {log_path})")
    yield server
    server.stop()
