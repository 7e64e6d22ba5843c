"""The OpenAPI schema tells the truth (issue 39.6): schemathesis' ``--checks all`` over the service's own schema, the
documented run (docs/SECURITY.md) bounded to a few examples per route, finds nothing: no 5xx, every answer and status
as the schema says, every request the schema allows served (no 4xx for it), every request it forbids refused. A real
service (the packaged model, real Redis, the embedded Milvus Lite) with an all-scopes key.

The one thing JSON Schema cannot say is which strings are valid Milvus expressions (``filter``, ``sync.scope``): on the
routes that take one, "a request the schema allows is served" also accepts a 422 (schemathesis.toml says why)."""

import shutil
import subprocess
import sys
from pathlib import Path

from ragcache.settings import Settings
from tests.live_server import LiveServer

KEY = "schema-truth-key-0123456789abcdef"
CONFIG = Path(__file__).with_name("schemathesis.toml")  # 413 counts as refusing schema-violating data


def st_run(url: str, *options: str) -> subprocess.CompletedProcess:
    st = shutil.which("st") or str(Path(sys.executable).with_name("st"))
    return subprocess.run(
        [st, "--config-file", str(CONFIG), "run", f"{url}/openapi.json", "--checks", "all", "--max-examples", "5", "--seed", "1",
         "--phases", "coverage,fuzzing,stateful", "--header", f"Authorization: Bearer {KEY}", *options],
        capture_output=True, text=True, timeout=600)


def failures_of(output: str) -> str:
    """schemathesis' report with each line cut to 400 characters (a generated body can be a megabyte), the failures
    section first: what to read when the run fails."""
    lines = [line if len(line) <= 400 else line[:400] + f"... ({len(line)} characters)" for line in output.splitlines()]
    start = next((i for i, line in enumerate(lines) if "FAILURES" in line), 0)
    return "\n".join(lines[start:start + 120] + ["...", *lines[-40:]])


def test_schemathesis_checks_all_find_nothing(redis_url, tmp_path):
    settings = Settings(redis_url=redis_url, data_dir=tmp_path, api_key=KEY, rate_limit_per_s=10_000.0, max_body_bytes=1 << 20)
    with LiveServer(settings) as live:
        # The prefix routes are left out: a generated target URL would be warmed (an outgoing request).
        run = st_run(live.url, "--exclude-path-regex", "^/prefixes")
    summary = [line for line in run.stdout.splitlines() if " generated" in line]
    assert run.returncode == 0, failures_of(run.stdout)
    assert summary and "passed" in summary[-1], run.stdout[-2000:]
