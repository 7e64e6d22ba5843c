"""Make docs/ui.png, the README's picture of the /ui dashboard, from a real service under a Zipf stream.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/ui_screenshot.py [docs/ui.png] [--seconds 45]

Starts the service in this process (embedded Redis, Milvus Lite in a temporary folder, a small L1 so that L2
serves too), ingests a few documents, registers a prefix whose vLLM is not running, replays a Zipf stream of
repeated texts while headless Chromium (Debian's, through Playwright) watches /ui refresh every second,
runs a search in the playground, and saves a full-page screenshot.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from ragcache.settings import Settings
from ragcache.storage.processes import free_port
from tests.live_server import LiveServer

KEY = "screenshot-admin-key-0123"
PASSAGES = [
    "A KV cache keeps attention keys and values so a prefix is not computed again.",
    "Milvus is a database for vector similarity search.",
    "An LRU cache evicts the least recently used entry first.",
    "Redis keeps values in memory and can expire them after a time to live.",
    "Prefix caching lets vLLM skip the prefill of a prompt head it still holds.",
]


def zipf_texts(num_texts: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    pool = [f"question {rank} about caches and retrieval" for rank in range(1, 400)]
    weights = [1 / rank**1.1 for rank in range(1, 400)]
    return rng.choices(pool, weights, k=num_texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default="docs/ui.png")
    parser.add_argument("--seconds", type=float, default=45.0, help="how long the stream runs while the page watches")
    args = parser.parse_args()
    keys = json.dumps({"keys": [{"name": "ops", "key": KEY, "scopes": "*"}]})
    with tempfile.TemporaryDirectory() as folder:
        # L1 holds about 60 vectors of 384 float32: the stream's tail goes on to L2.
        # The disk level on, as `make serve` has it (ragcache serve turns it on in the data folder); the prefix's vLLM
        # (not running) is an allowed target, as a service with keys requires.
        prefix_target = f"http://127.0.0.1:{free_port()}"
        settings = Settings(data_dir=Path(folder), api_keys=keys, l1_bytes=60 * 384 * 4, disk_path=str(Path(folder) / "disk"),
                            prefix_allowed_targets=[prefix_target])
        with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=120,
                                                        headers={"Authorization": f"Bearer {KEY}"}) as http:
            documents = [{"id": f"p{i}", "text": text} for i, text in enumerate(PASSAGES)]
            http.post("/documents", json={"collection": "notes", "documents": documents}).raise_for_status()
            target = {"base_url": prefix_target, "model": "tiny"}
            prefix = {"name": "support", "text": "You are a support assistant.\n\n", "target": target}
            http.post("/prefixes", json=prefix).raise_for_status()
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.goto(live.url + "/ui")
                page.select_option("#interval", "1000")
                page.fill("#key", KEY)
                page.click("#key-form button[type=submit]")
                stream, deadline = iter(zipf_texts(100_000)), time.monotonic() + args.seconds
                while time.monotonic() < deadline:
                    http.post("/embed", json={"inputs": [next(stream) for _ in range(16)]}).raise_for_status()
                    time.sleep(0.2)
                page.fill("#collection", "notes")
                page.fill("#query", "which entry does an LRU evict first?")
                page.fill("#top-k", "3")
                page.click("#search-button")
                page.wait_for_selector("#hits tr[data-hit]")
                time.sleep(1.5)
                page.screenshot(path=args.output, full_page=True)
                browser.close()
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
