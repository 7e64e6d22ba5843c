"""``ragcache stats`` and ``--watch``: the table rendered from a real service's /stats, the interval column
computed from two answers, a bounded watch against the live service; progress bars of long commands."""

from __future__ import annotations

import io
import re

import pytest

from ragcache.client import Client
from ragcache.observe.progress import progress_bar
from ragcache.settings import Settings
from ragcache_cli.cli import main
from ragcache_cli.stats_view import CLEAR_SCREEN, render_stats, watch_stats
from tests.live_server import LiveServer

TEXTS = ["What is a KV cache?", "Milvus stores vectors.", "Redis keeps L2.", "An LRU evicts the oldest entry."]


class Terminal(io.StringIO):
    """An output that says it is a terminal (the watch clears the screen only on one)."""

    def isatty(self) -> bool:
        return True


def level_row(table: str, level: str) -> list[str]:
    match = re.search(rf"^  {level} .*$", table, re.M)
    assert match, f"no {level} row in:\n{table}"
    return match.group(0).split()


@pytest.fixture(scope="module")
def live(tmp_path_factory, redis_server):
    # With a disk level, as under `make serve`: L3 then admits only vectors that proved reuse.
    data_dir = tmp_path_factory.mktemp("watch")
    with LiveServer(Settings(redis_url=redis_server, data_dir=data_dir, disk_path=str(data_dir / "disk"))) as server:
        yield server


def test_render_real_stats_and_the_interval_column(live):
    with Client(live.url) as client:
        client.embed(TEXTS)  # 4 computed
        before = client.stats()
        client.embed(TEXTS)
        client.embed(TEXTS[:2])  # 6 texts, all from L1
        after = client.stats()

    once = render_stats(after)
    entry = next(iter(after["models"].values()))
    assert entry["space"]["space_id"] in once
    l1 = level_row(once, "L1")
    overall = entry["since_start"]["levels"][0]
    assert l1[:6] == ["L1", "yes", f"{overall['lookups']:,}", f"{overall['hits']:,}", f"{overall['misses']:,}", "0"]
    assert "last" not in once  # one answer: no interval to speak of

    table = render_stats(after, before, interval_s=2)
    assert "last 2s: 6 texts, hit rate 1.000" in table
    # Between the two answers L1 was asked 6 times and held all 6.
    assert level_row(table, "L1")[8] == "1.000"
    # L2 was not asked at all in between (every text was in L1).
    assert level_row(table, "L2")[8] == "-"
    # L3's admission, under its row: the 4 computed vectors declined, none served from below L1, so none admitted.
    assert entry["levels"]["L3"] == {**entry["levels"]["L3"], "admission": "reuse", "num_admitted": 0, "num_declined": 4}
    lines = once.splitlines()
    l3_row = next(i for i, line in enumerate(lines) if line.startswith("  L3 "))
    assert lines[l3_row + 1:l3_row + 3].count("        admission reuse: admitted 0, declined 4") == 1
    assert once.count("admission") == 1  # the other levels take every vector: no line
    # The model's drift check (docs/drift.md): checked once at start, nothing changed.
    assert re.search(r"^  drift stable  generation 0  events 0  checks 1 \(failed 0\)  canary distance (0|-) ", once, re.M), once


def test_watch_renders_count_tables_and_clears_only_a_terminal():
    answers = iter([
        {"models": {}},
        {"models": {}},
        {"models": {}},
    ])
    naps: list[float] = []
    screen = Terminal()
    shown = watch_stats(lambda: next(answers), interval_s=1.5, count=3, out=screen, title="t", sleep=naps.append)
    assert shown == 3 and naps == [1.5, 1.5]
    assert screen.getvalue().count(CLEAR_SCREEN) == 3
    pipe = io.StringIO()
    watch_stats(lambda: {"models": {}}, interval_s=1, count=2, out=pipe, sleep=naps.append)
    assert CLEAR_SCREEN not in pipe.getvalue() and pipe.getvalue().count("every 1 s") == 2


def test_stats_watch_command_against_the_live_service(live, capsys):
    with Client(live.url) as client:
        client.embed(TEXTS)
    assert main(["stats", "--watch", "--count", "2", "--interval", "0.2", "--url", live.url]) == 0
    out = capsys.readouterr().out
    assert out.count(f"ragcache {live.url}") == 2  # two refreshes, then it stopped
    assert out.count("  L1 ") == 2 and "last 0.2s" in out
    assert CLEAR_SCREEN not in out  # captured output is not a terminal


def test_stats_command_rejects_a_bad_interval(live, capsys):
    assert main(["stats", "--watch", "--interval", "0", "--url", live.url]) == 1
    assert "--interval" in capsys.readouterr().err


def test_progress_bar_is_off_when_quiet_or_not_a_terminal():
    with progress_bar(desc="x", unit="doc", quiet=True) as bar:
        assert bar.disable
    # pytest captures stderr, so it is not a terminal here: no carriage-return noise in logs.
    with progress_bar(desc="x", unit="doc", total=3) as bar:
        assert bar.disable
        bar.update(3)


def test_ingest_quiet_writes_no_progress(live, tmp_path, capsys):
    (tmp_path / "a.md").write_text("First paragraph about caches.\n\nSecond paragraph about vectors.")
    assert main(["ingest", str(tmp_path), "--collection", "watch_docs", "--quiet", "--url", live.url]) == 0
    captured = capsys.readouterr()
    assert "1 documents in 'watch_docs'" in captured.out
    assert captured.err == ""
