"""The docs site's benchmarks page is generated from the committed JSON and cannot drift from it."""

import json
from pathlib import Path

from ragcache_bench.site_page import RESULTS, render

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_what_the_json_gives():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page == render(), "docs/benchmarks.md is stale: run `make docs-benchmarks`"
    assert len(page.splitlines()) <= 300


def test_no_benchmark_result_lies_at_the_repository_root():
    assert not list(ROOT.glob("BENCHMARKS*")), "results go under benchmarks/results/<round>-<commit>/"
    assert RESULTS == ROOT / "benchmarks" / "results"


def _write(folder: Path, mode: str, time_utc: str, verdict: str) -> None:
    folder.mkdir(parents=True)
    figure = {"name": "ratio", "value": 1.5, "unit": "x", "target": ">= 1 x", "verdict": verdict, "goal": "",
              "note": ""}
    payload = {"mode": mode, "command": "ragcache bench zipf", "machine": {"time_utc": time_utc, "git_commit": "abc1234",
               "load_avg": [0.5]}, "result": {"name": "zipf", "title": "zipf", "figures": [figure]}}
    (folder / "zipf.json").write_text(json.dumps(payload))


def test_the_newest_full_run_wins_over_a_newer_quick_one(tmp_path):
    _write(tmp_path / "results" / "r1-abc1234", "full", "2026-01-01T00:00:00Z", "PASS")
    _write(tmp_path / "results" / "r2-abc1234", "full", "2026-01-02T00:00:00Z", "MISS")
    _write(tmp_path / "results" / "r3-abc1234", "quick", "2026-01-03T00:00:00Z", "PASS")
    page = render(tmp_path / "results")
    assert "results/r2-abc1234/zipf.json" in page and "0 PASS, 1 MISS" in page
    assert "r1-abc1234" not in page and "r3-abc1234" not in page
