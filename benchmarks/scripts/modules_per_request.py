"""The library and service modules whose code runs while the service answers one ``/embed`` on its embedded defaults:
an L1 hit (a text embedded once before) and a miss (a new text), write-behind included (issue 41's "files an L1 hit
and a miss pass"). Every thread is profiled while the request runs; the modules of the loops that run whatever the
requests do (the prefix registry's keep-warm, the embedded servers' supervision) are left out.

    cd <a tree's root> && HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/scripts/modules_per_request.py

Run it in two trees (a ``git worktree`` of the commit before) for a side-by-side count.
"""

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path.cwd()
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from ragcache.settings import Settings  # noqa: E402
from tests.live_server import LiveServer  # noqa: E402

PACKAGES = tuple(str(ROOT / package) + os.sep for package in ("ragcache", "ragcache_server"))
BACKGROUND = ("ragcache/prefixes/", "ragcache/storage/embedded_redis.py", "ragcache/storage/supervision.py")

seen: set[str] = set()
profiling = threading.Event()


def profile(frame, event, arg) -> None:
    if profiling.is_set() and event == "call" and frame.f_code.co_filename.startswith(PACKAGES):
        seen.add(os.path.relpath(frame.f_code.co_filename, ROOT))


def modules_of(url: str, text: str) -> list[str]:
    seen.clear()
    profiling.set()
    response = httpx.post(f"{url}/embed", json={"inputs": [text]}, timeout=60)
    time.sleep(0.5)  # the write-behind threads run after the answer: they count too
    profiling.clear()
    response.raise_for_status()
    return sorted(name for name in seen if not name.startswith(BACKGROUND))


def main() -> None:
    threading.setprofile(profile)  # every thread started from here on: the server's, its workers', the writers'
    sys.setprofile(profile)
    with LiveServer(Settings(data_dir=Path(tempfile.mkdtemp()))) as live:
        httpx.post(f"{live.url}/embed", json={"inputs": ["a text asked twice"]}, timeout=60).raise_for_status()
        time.sleep(1)
        hit = modules_of(live.url, "a text asked twice")
        miss = modules_of(live.url, f"a new text {time.time()}")
    sys.setprofile(None)
    threading.setprofile(None)
    for name, modules in (("L1 hit", hit), ("miss", miss)):
        print(f"{name}: {len(modules)} modules: {', '.join(modules)}")


if __name__ == "__main__":
    main()
