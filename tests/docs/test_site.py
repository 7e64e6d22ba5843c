"""The docs site builds with ``mkdocs build --strict``: a broken link, a missing page in the nav, or a Python name
the reference can no longer find fails the suite (the reference pages are generated from the code at build)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    for page in ("index.html", "benchmarks/index.html", "configuration/index.html", "reference/cli/index.html",
                 "reference/http/index.html", "reference/python/index.html"):
        assert (tmp_path / page).is_file(), page
    http = (tmp_path / "reference" / "http" / "index.html").read_text()
    assert "/v1/embeddings" in http and "/search" in http
    python = (tmp_path / "reference" / "python" / "index.html").read_text()
    assert "open_cache" in python and "Client" in python
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text()
    assert "ragcache ingest" in cli
