"""Every shell, Python and HTTP example in README.md and docs/ runs, as written, against a live service started as
``make serve`` starts it (``ragcache serve`` with its embedded defaults, in a data folder of its own), so the docs
cannot drift from what the code does.

A block runs unless the line before its fence marks it ``<!-- docs-test: skip (why) -->``, and the why is
required: only what this machine or a test cannot have (a GPU, Docker, the internet, a vLLM or Ray cluster, a
second service on port 8000, a minutes-long run) is a reason. Blocks of a page run in the page's order against the
one service, so a page's later example may use what its earlier one made, as a reader following it would.

What "as written" allows: the service listens on a free port, not 8000, so ``localhost:8000`` and
``127.0.0.1:8000`` are rewritten to it and ``RAGCACHE_URL`` points the command line at it. A shell block runs
under ``bash -e -o pipefail`` from the checkout's root with ``curl`` failing on an HTTP error (a 404 answered as
JSON is an example that does not work); a Python block runs in a fresh interpreter; an ``http`` block (``METHOD
/path``, headers, a blank line, a body) is sent as is and must answer 2xx.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from ragcache.storage.processes import free_port, stop_process, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"sh": "shell", "bash": "shell", "shell": "shell", "console": "shell", "python": "python", "py": "python",
       "http": "http"}
NOT_RUN = {"text", "json", "toml", "yaml", "ini", "env"}  # pictures and configuration files, not commands
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*(?:\((?P<why>.*)\))?\s*-->")
FENCE = re.compile(r"^(?P<indent> {0,3})```(?P<lang>[\w+-]*)\s*$")
TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None  # the marker's reason; "" for a marker without one

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    found, lines, index = [], page.read_text(encoding="utf-8").splitlines(), 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = SKIP.search(before)
        found.append(Block(page, index + 1, opening["lang"], "\n".join(lines[index + 1:end]) + "\n",
                           None if marker is None else (marker["why"] or "").strip()))
        index = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks_of(page)]
RUNNABLE = [block for block in ALL_BLOCKS if block.lang in RUN]


def test_every_fence_names_its_language_and_every_skip_says_why():
    unnamed = [block.id for block in ALL_BLOCKS if block.lang not in RUN and block.lang not in NOT_RUN]
    assert not unnamed, f"fences without a known language (sh, python, http, or text/json/toml/yaml): {unnamed}"
    unexplained = [block.id for block in ALL_BLOCKS if block.skip == ""]
    assert not unexplained, f"skip markers must say why, <!-- docs-test: skip (needs a GPU) -->: {unexplained}"
    assert len([block for block in RUNNABLE if block.skip is None]) >= 10  # the tour alone has more


CONFIGURATION = [block for block in ALL_BLOCKS if block.lang in ("json", "toml", "yaml")]


@pytest.mark.parametrize("block", CONFIGURATION, ids=[block.id for block in CONFIGURATION])
def test_configuration_example_parses(block):
    # A configuration file shown in the docs is one its reader can paste: it parses as the language it names.
    if block.lang == "json":
        json.loads(block.code)
    elif block.lang == "toml":
        tomllib.loads(block.code)
    else:
        yaml.safe_load(block.code)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """``ragcache serve`` as ``make serve`` runs it, its ./data in a folder of its own."""
    workdir = tmp_path_factory.mktemp("make-serve")
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env = {name: value for name, value in env.items() if not name.startswith("RAGCACHE_")}
    log_path = workdir / "service.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(Path(sys.executable).parent / "ragcache"), "serve", "--host", "127.0.0.1",
                                    "--port", str(port)], cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(process, f"http://127.0.0.1:{port}/health", name="the service", timeout_s=600,
                         interval_s=0.5, log_tail=lambda: log_path.read_text(errors="replace")[-3000:])
            yield port, workdir
        finally:
            stop_process(process, timeout_s=60)


def _as_written(code: str, port: int) -> str:
    return re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", f"127.0.0.1:{port}", code)


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    # A session of its own: an example that starts a service (a mistake this test exists to catch) is stopped with
    # everything it started when its time is up, SIGTERM first so that an embedded Redis is stopped by its owner.
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        pytest.fail(f"still running after {TIMEOUT_S} s (stopped)\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _run_shell(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # curl exits 0 on a 404 or a 500; a documented request that the service refuses is an example that fails.
    prelude = "set -eo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
    return _run(["bash", "-c", prelude + code], ROOT, env)


def _run_python(code: str, env: dict[str, str], workdir: Path) -> subprocess.CompletedProcess:
    script = workdir / "example.py"
    script.write_text(code)
    # A folder of its own: an in-process example opens ./data there, never beside the service's.
    return _run([sys.executable, str(script)], workdir, env)


def _send_http(code: str) -> str:
    head, _, body = code.partition("\n\n")
    request_line, *header_lines = head.strip().splitlines()
    method, path = request_line.split()[:2]
    headers = dict(line.split(":", 1) for line in header_lines)
    host = headers.pop("Host", headers.pop("host", "127.0.0.1:8000")).strip()
    answer = httpx.request(method, f"http://{host}{path}", headers={k.strip(): v.strip() for k, v in headers.items()},
                           content=body.encode(), timeout=TIMEOUT_S)
    assert answer.is_success, f"{method} {path} -> {answer.status_code}: {answer.text[:2000]}"
    return answer.text


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.id for block in RUNNABLE])
def test_example_runs_as_written(block, service, tmp_path):
    if block.skip is not None:
        pytest.skip(block.skip)
    port, _ = service
    code = _as_written(block.code, port)
    # As a reader who activated the environment (README: `. .venv/bin/activate`) has it: `ragcache` on the PATH.
    env = {**os.environ, "RAGCACHE_URL": f"http://127.0.0.1:{port}", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    kind = RUN[block.lang]
    if kind == "http":
        print(_send_http(code))
        return
    done = _run_shell(code, env) if kind == "shell" else _run_python(code, env, tmp_path)
    print(done.stdout)
    assert done.returncode == 0, (
        f"{block.id} ({block.lang}) exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n"
        f"{done.stderr[-3000:]}")
    assert "Traceback (most recent call last)" not in done.stderr, done.stderr[-3000:]
