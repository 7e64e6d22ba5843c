"""The command line's help and errors in terms a person acts on: every option explained, the key named as the CLI
takes it, the files ingest skipped named, a settings typo named with the nearest setting, a bad value in one line."""

from __future__ import annotations

import argparse
import http.server
import logging
import re
import threading

import pytest

from ragcache.errors import ConfigError
from ragcache.settings import Settings
from ragcache.settings.checks import unknown_variables
from ragcache_cli.cli import build_parser, main


def all_parsers(parser: argparse.ArgumentParser, path: str = "ragcache"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_parsers(sub, f"{path} {name}")


def test_every_option_of_every_command_has_help():
    missing = [f"{path} {action.option_strings or action.dest}" for path, parser in all_parsers(build_parser())
               for action in parser._actions
               if not isinstance(action, argparse._SubParsersAction) and not action.help]
    assert missing == []


def test_the_top_line_is_plain_text_and_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert "``" not in shown
    description = " ".join(shown.split("\n\n")[1].split())
    for command in ["serve", "ingest", "search", "rerank", "stats", "config", "milvus-server", "bench"]:
        assert command in description


def test_bench_lists_benchmarks_with_descriptions_not_issue_numbers(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    listing = capsys.readouterr().out
    assert "levels" in listing and "cold" in listing
    assert re.findall(r"\(\d+(?:\.\d+)?(?:, \d+(?:\.\d+)?)*\)", listing) == []  # "(5)", "(28.5)", "(14.2, 14.3)"


def test_the_filter_help_shows_the_syntax(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    assert 'metadata["topic"] == "db"' in " ".join(capsys.readouterr().out.split())


class _Refuses(http.server.BaseHTTPRequestHandler):
    """A service that wants a key: every request a JSON 401, as ragcache's auth answers one."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = b'{"error": {"code": "unauthorized", "message": "send Authorization: Bearer <key>"}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_401_names_the_cli_s_own_ways_to_pass_a_key(refusing_url, capsys, monkeypatch):
    monkeypatch.delenv("RAGCACHE_API_KEY", raising=False)
    assert main(["stats", "--url", refusing_url]) == 1
    error = capsys.readouterr().err
    assert "--api-key" in error and "RAGCACHE_API_KEY" in error
    assert "Client(" not in error and "Authorization" not in error
    assert main(["stats", "--url", refusing_url, "--api-key", "wrong"]) == 1
    assert "refused the API key given" in capsys.readouterr().err


def test_ingest_of_a_folder_with_nothing_it_reads_names_the_files_and_fails(tmp_path, capsys):
    (tmp_path / "scan.png").write_bytes(b"\x89PNG")
    (tmp_path / "broken.pdf").write_bytes(b"not a pdf")
    # Nothing is sent, so no service is needed to see the answer.
    assert main(["ingest", str(tmp_path), "--collection", "c", "--url", "http://127.0.0.1:9", "--quiet"]) == 1
    error = capsys.readouterr().err
    assert "skipped scan.png: not a kind ingest reads" in error
    assert "skipped broken.pdf: not a readable PDF" in error
    assert f"nothing was ingested from {tmp_path}" in error


def test_a_settings_typo_is_named_with_the_nearest_setting():
    lines = unknown_variables({"RAGCACHE_L1_BYTE": "5", "RAGCACHE_REDIS_URL": "off", "RAGCACHE_URL": "http://x",
                               "RAGCACHE_TEST_REDIS_URL": "x", "RAGCACHE_INFINITY_PYTHON": "x", "PATH": "/bin",
                               "RAGCACHE_NOTHING_LIKE_IT": "1"}, Settings.options())
    assert lines == [
        "RAGCACHE_L1_BYTE is not a ragcache setting and is ignored; did you mean RAGCACHE_L1_BYTES?",
        "RAGCACHE_NOTHING_LIKE_IT is not a ragcache setting and is ignored (ragcache config --markdown lists every setting)",
    ]


def test_loading_settings_warns_of_a_typo_once(monkeypatch, caplog):
    monkeypatch.setenv("RAGCACHE_REDIS_ULR", "off")
    with caplog.at_level(logging.WARNING, logger="ragcache.settings"):
        Settings.load()
        Settings.load()
    named = [record.getMessage() for record in caplog.records if "RAGCACHE_REDIS_ULR" in record.getMessage()]
    assert named == ["RAGCACHE_REDIS_ULR is not a ragcache setting and is ignored; did you mean RAGCACHE_REDIS_URL?"]


def test_a_bad_value_is_one_line_naming_its_variable(monkeypatch, capsys):
    monkeypatch.setenv("RAGCACHE_L1_BYTES", "lots")
    with pytest.raises(ConfigError) as info:
        Settings.load()
    assert str(info.value).startswith("invalid settings: RAGCACHE_L1_BYTES: Input should be a valid integer")
    assert "\n" not in str(info.value) and "lots" not in str(info.value)
    assert main(["config"]) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_ingest_reads_pdf_and_html_into_a_live_service_and_names_the_rest(redis_url, tmp_path, capsys):
    from tests.live_server import LiveServer
    from tests.retrieval.test_ingest_formats import HTML, pdf_bytes

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "paper.pdf").write_bytes(pdf_bytes([["Lobsters molt their shells to grow."], ["Page two: tide pools."]]))
    (corpus / "page.html").write_text(HTML)
    (corpus / "photo.png").write_bytes(b"\x89PNG")
    with LiveServer(Settings(redis_url=redis_url, data_dir=tmp_path / "data")) as live:
        assert main(["ingest", str(corpus), "--collection", "formats", "--url", live.url, "--quiet"]) == 0
        shown = capsys.readouterr()
        assert "2 documents in 'formats'" in shown.out  # one chunk each: the PDF's two pages fit one chunk
        named = [line for line in shown.err.splitlines() if line.startswith("skipped")]  # (the in-process server's model logs too)
        assert named == ["skipped photo.png: not a kind ingest reads (.htm, .html, .jsonl, .markdown, .md, .pdf, .rst, .txt)"]
        assert main(["search", "how do lobsters grow?", "--collection", "formats", "--top-k", "1", "--url", live.url]) == 0
        assert "paper.pdf#0" in capsys.readouterr().out
