"""The command line against a real server: ingest files (chunked), search, stats."""

import json

import pytest

from ragcache.retrieval.ingest import chunk_text, iter_documents
from ragcache.settings import Settings
from ragcache_cli.cli import main
from tests.live_server import LiveServer


def test_chunking_merges_paragraphs_and_splits_long_ones():
    text = "one\n\ntwo\n\n" + "word " * 100
    chunks = chunk_text(text, max_chars=120)
    assert chunks[0] == "one\n\ntwo"
    assert all(len(chunk) <= 120 for chunk in chunks) and "".join(chunks[1:]).count("word") == 100


def test_jsonl_and_markdown_documents_have_stable_ids(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\nFirst paragraph.\n\nSecond paragraph.")
    (tmp_path / "b.jsonl").write_text(json.dumps({"id": "x1", "text": "from jsonl", "metadata": {"lang": "en"}}) + "\n")
    documents = list(iter_documents(tmp_path))
    assert [d["id"] for d in documents] == ["a.md#0", "x1"]
    assert documents[1]["metadata"] == {"source": "b.jsonl", "lang": "en"}


def test_ingest_search_stats_commands(redis_url, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "kv.md").write_text("A KV cache keeps attention keys and values between decoding steps.")
    (corpus / "fruit.txt").write_text("Bananas are a yellow tropical fruit.\n\nApples can be red or green.")
    with LiveServer(Settings(redis_url=redis_url, data_dir=tmp_path / "data")) as live:
        assert main(["ingest", str(corpus), "--collection", "cli_docs", "--url", live.url]) == 0
        assert "2 documents in 'cli_docs'" in capsys.readouterr().out  # fruit.txt's paragraphs merge into one chunk
        assert main(["search", "what does a kv cache keep?", "--collection", "cli_docs", "--top-k", "1", "--url", live.url]) == 0
        assert "kv.md#0" in capsys.readouterr().out
        assert main(["stats", "--url", live.url]) == 0
        table = capsys.readouterr().out
        assert "L1" in table and "hit rate" in table
        assert main(["search", "x", "--collection", "missing", "--url", live.url]) == 1
        assert "does not exist" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    with pytest.raises(SystemExit):
        main(["--help"])


def test_a_url_with_credentials_is_refused_and_never_printed(capsys):
    """httpx would send user:password@ as Basic auth in place of the Bearer key (a 401 that says nothing), and
    `stats --watch` printed the URL in its title."""
    assert main(["stats", "--watch", "--count", "1", "--url", "http://ops:hunter2@127.0.0.1:9"]) == 1
    shown = capsys.readouterr()
    assert "carries credentials" in shown.err and "api_key" in shown.err
    assert "hunter2" not in shown.out + shown.err
