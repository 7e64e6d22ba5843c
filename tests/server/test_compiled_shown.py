"""Which implementation of each C/Python pair serves (``ragcache.observe.compiled``) is shown to the operator: in an
admin's ``/info`` and in ``ragcache config`` (issue 41.5)."""

from __future__ import annotations

import httpx

from ragcache.settings import Settings
from ragcache_cli.cli import main
from tests.live_server import LiveServer

BUILT = {"base64_answer": "compiled", "lru_kernels": "compiled"}  # `make install` builds both here


def test_info_says_which_implementation_serves(tmp_path):
    with LiveServer(Settings(redis_url="off", milvus_uri="off", data_dir=tmp_path)) as live:
        info = httpx.get(live.url + "/info", timeout=60).json()
    assert info["implementations"] == BUILT


def test_config_says_which_implementation_serves_and_stays_a_settings_file(tmp_path, capsys):
    assert main(["config"]) == 0
    printed = capsys.readouterr().out
    assert "# compiled loops: base64_answer=compiled, lru_kernels=compiled" in printed.splitlines()
    round_trip = tmp_path / "printed.env"
    round_trip.write_text(printed)
    assert Settings.load(round_trip) == Settings.load(None)
