"""Property-based fuzzing of the HTTP API from its own OpenAPI schema: no input may produce a 5xx.

Schemathesis generates bodies (wrong types, odd Unicode, huge numbers, missing fields...) for every route and
checks each answer; the prefix routes are left out because a generated target URL would be warmed.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from ragcache.settings import Settings
from tests.live_server import LiveServer


def test_no_generated_input_gets_a_server_error(redis_url, tmp_path):
    st = shutil.which("st") or str(Path(sys.executable).with_name("st"))
    with LiveServer(Settings(redis_url=redis_url, data_dir=tmp_path)) as live:
        run = subprocess.run(
            [st, "run", f"{live.url}/openapi.json", "--checks", "not_a_server_error", "--max-examples", "40",
             "--seed", "1", "--phases", "coverage,fuzzing", "--exclude-path-regex", "^/prefixes"],
            capture_output=True, text=True, timeout=600,
        )
    summary = [line for line in run.stdout.splitlines() if " generated" in line]
    assert run.returncode == 0, run.stdout[-4000:]
    assert summary and "passed" in summary[-1], run.stdout[-2000:]
