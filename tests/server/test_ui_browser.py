"""The /ui dashboard in a real browser: Debian's headless Chromium driven by Playwright (the system browser,
no `playwright install`), against a real service with keys, real Redis, Milvus Lite and the model.

The page must show exactly what /stats says once traffic stops, draw the hit-rate chart from live refreshes,
list prefixes, run a search, show each panel's refusal for a key without the scope, keep the key out of every
URL, and fetch nothing from anywhere but the service. Screenshots go to the test's temporary folder.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import time
import zlib
from contextlib import closing
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from playwright import sync_api as playwright_api

from ragcache.settings import Settings
from ragcache.storage.processes import free_port
from tests.live_server import LiveServer
from tests.models.remote.loopback import LoopbackServer, Received, Reply
from tests.prefixes.kv_publisher import KVPublisher, removed, stored
from tests.prefixes.recording_server import RecordingServer

CHROMIUM = "/usr/bin/chromium"
ADMIN_KEY = "ui-admin-key-0123456789"
SEARCH_KEY = "ui-search-key-0123456789"
WAIT_S = 60  # how long the page may take to show what the test waits for, on a loaded 2-core machine
# The vLLM stand-in's /tokenize: 40 tokens, two full KV blocks of the registry's default 16 (its /metrics names none).
ENGINE_TOKENS, ENGINE_BLOCK = 40, 16


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    keys = {"keys": [{"name": "ops", "key": ADMIN_KEY, "scopes": "*"},
                     {"name": "app", "key": SEARCH_KEY, "scopes": ["search"]}]}
    no_vllm = f"http://127.0.0.1:{free_port()}"  # listed for prefixes: a service with keys calls no other URL
    # A second target that publishes KV events: a loopback vLLM stand-in and a ZMQ publisher of the tests' own.
    with RecordingServer(num_tokens=ENGINE_TOKENS) as vllm, closing(KVPublisher().start()) as publisher:
        events = {vllm.url: {"endpoint": publisher.endpoint, "replay_endpoint": publisher.replay_endpoint}}
        # With a disk level, as under `make serve`: its fill has a row of its own, and L3 admits on reuse.
        data_dir = tmp_path_factory.mktemp("ui")
        settings = Settings(redis_url=redis_server, data_dir=data_dir, disk_path=str(data_dir / "disk"), api_keys=json.dumps(keys),
                            prefix_allowed_targets=[no_vllm, vllm.url], prefix_kv_events=events)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=120, headers=headers) as admin:
            documents = [
                {"id": "kv", "text": "A KV cache keeps attention keys and values so a prefix is not computed again."},
                {"id": "milvus", "text": "Milvus is a database for vector similarity search."},
                {"id": "lru", "text": "An LRU cache evicts the least recently used entry first."},
            ]
            assert admin.post("/documents", json={"collection": "notes", "documents": documents}).status_code == 200
            # vLLM is not running: registering still works, and the prefix shows up with its failed warm.
            target = {"base_url": no_vllm, "model": "tiny"}
            prefix = {"name": "support", "text": "You are a support assistant. Answer from the context.\n\n", "target": target}
            assert admin.post("/prefixes", json=prefix).status_code in (200, 201)
            engine = {"name": "engine", "text": "You answer from the context only.\n", "target": {"base_url": vllm.url, "model": "tiny"}}
            assert admin.post("/prefixes", json=engine).status_code in (200, 201)
            live.admin, live.vllm, live.publisher = admin, vllm, publisher
            yield live


@pytest.fixture(scope="module")
def browser():
    if shutil.which("chromium") is None:
        pytest.fail("chromium is not installed (apt-get install chromium; make test does: mk/system.mk)")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    opened = context.new_page()
    opened.requested = []
    opened.on("request", lambda request: opened.requested.append(request))
    opened.errors = []
    opened.on("pageerror", lambda error: opened.errors.append(str(error)))
    yield opened
    context.close()
    assert not opened.errors, opened.errors


def open_with_key(page, server, key: str | None) -> None:
    page.goto(server.url + "/ui")
    if key is not None:
        page.fill("#key", key)
        page.click("#key-form button[type=submit]")


def embed(server, texts: list[str], times: int = 1) -> None:
    for _ in range(times):
        assert server.admin.post("/embed", json={"inputs": texts}).status_code == 200


def wait_for(condition, what: str) -> None:
    """Poll from Python: the page's Content-Security-Policy forbids eval, which Playwright's wait_for_function needs."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"the page never showed {what}"
        time.sleep(0.25)


def refreshes(page) -> int:
    return int(page.get_attribute("body", "data-refreshes") or 0)


def shown(page, selector: str) -> str | None:
    return page.get_attribute(selector, "data-value")


def wait_until_page_shows(page, server) -> dict:
    """/stats once the page's figures equal it (the page refreshes every 2 s; no traffic runs meanwhile)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        stats = server.admin.get("/stats").json()
        model, entry = next(iter(stats["models"].items()))
        texts = page.locator(f'[data-model="{model}"] .tile[data-field="texts"]')
        if texts.count() and texts.get_attribute("data-value") == str(entry["since_start"]["texts"]):
            return stats
        assert time.monotonic() < deadline, "the page never showed the service's current figures"
        time.sleep(0.5)


def number(text: str | None) -> float:
    assert text is not None
    return float(text)


def test_the_page_shows_what_stats_says_and_runs_a_search(page, server, tmp_path):
    open_with_key(page, server, ADMIN_KEY)
    page.wait_for_selector("[data-model] .tile[data-field=texts]", timeout=WAIT_S * 1000)
    # Traffic between refreshes: the chart gets points (hit rate per level over time).
    texts = [f"dashboard text {i}" for i in range(8)]
    embed(server, texts)
    wait_for(lambda: refreshes(page) >= 3, "three refreshes")
    embed(server, texts, times=3)
    server.state.caches[server.state.default_model].flush()
    stats = wait_until_page_shows(page, server)

    model, entry = next(iter(stats["models"].items()))
    card = f'[data-model="{model}"]'
    totals = entry["since_start"]
    for field in ("texts", "hit_rate", "texts_computed", "compute_s_saved", "compute_s", "requests"):
        assert number(shown(page, f'{card} .tile[data-field="{field}"]')) == pytest.approx(totals[field]), field
    assert page.inner_text(f'{card} .tile[data-field="texts"] .value') == f"{totals['texts']:,}"
    for level in totals["levels"]:
        row = f'{card} tr[data-level="{level["level"]}"]'
        for field in ("lookups", "hits", "misses", "errors", "hit_rate", "latency_p50_ms", "latency_p99_ms"):
            assert number(shown(page, f'{row} [data-field="{field}"]')) == pytest.approx(level[field]), (level["level"], field)
        assert json.loads(shown(page, f'{row} [data-field="misses_by_cause"]')) == level["misses_by_cause"], level["level"]
        state = entry["levels"][level["level"]]
        assert shown(page, f'{row} [data-field="up"]') == ("true" if state["up"] else "false")
        assert number(shown(page, f'{row} [data-field="num_outages"]')) == state["num_outages"]
    # Each level's fill in its own row, under a heading that names no level (it was "L1 fill", over the disk's too).
    headings = page.locator(f"{card} table.levels th").all_inner_texts()
    assert "fill" in headings and "L1 fill" not in headings and "admission" in headings
    for name in ("L1", "disk"):
        fill, level_state = f'{card} tr[data-level="{name}"] [data-field="used_bytes"]', entry["levels"][name]
        assert number(shown(page, fill)) == level_state["used_bytes"] > 0, name
        assert page.get_attribute(fill, "title") == f'{level_state["used_bytes"]} of {level_state["capacity_bytes"]} bytes'
    # L3 takes only what proved reuse: the rule and its counts, as /stats has them; the other levels show none.
    l3, admission = entry["levels"]["L3"], f'{card} tr[data-level="L3"] [data-field="admission"]'
    assert l3["admission"] == "reuse" and l3["num_declined"] == totals["texts_computed"] > 0
    assert shown(page, admission) == "reuse"
    assert number(page.get_attribute(admission, "data-admitted")) == l3["num_admitted"]
    assert number(page.get_attribute(admission, "data-declined")) == l3["num_declined"]
    assert page.inner_text(admission) == f'reuse: {l3["num_admitted"]:,} admitted, {l3["num_declined"]:,} declined'
    assert page.locator(f'{card} [data-field="admission"]').count() == 1
    assert number(shown(page, f'{card} tr[data-level="compute"] [data-field="hits"]')) == totals["texts_computed"]
    # The chart drew the hit rate of each level between refreshes: a line per level (no "any level" line over L1's,
    # which hid it), on a time axis of the last five minutes.
    chart = f'svg[data-chart="{model}"]'
    assert page.locator(f"{chart} polyline, {chart} circle").count() >= 1
    assert page.locator(f'{chart} [data-line="L1"]').count() >= 1 and page.locator(f'{chart} [data-line="any level"]').count() == 0
    # The axis spans what the page has seen (one minute at least, five at most), labelled in time before now.
    ticks = page.locator(f"{chart} [data-tick]").all_text_contents()
    assert ticks[-1] == "now" and len(ticks) >= 3 and all(re.fullmatch(r"-\d+ (s|min)", tick) for tick in ticks[:-1]), ticks
    assert [name for name in page.locator(f"{card} [data-legend]").all_inner_texts()] == [level["level"] for level in totals["levels"]]

    prefix_row = 'tr[data-prefix="support"]'
    page.wait_for_selector(prefix_row, timeout=WAIT_S * 1000)
    prefix = server.admin.get("/prefixes/support/stats").json()
    assert number(shown(page, f'{prefix_row} [data-field="version"]')) == prefix["version"]
    assert page.inner_text(f'{prefix_row} [data-field="last_warm_at"]') != ""

    page.screenshot(path=str(tmp_path / "ui-stats.png"), full_page=True)
    query = "which entry does an LRU evict first?"
    run_search(page, query)
    expected = server.admin.post("/search", json={"collection": "notes", "query": query, "top_k": 3}).json()
    ids = [page.get_attribute(f"#hits tr[data-hit]:nth-child({i + 2})", "data-hit") for i in range(len(expected["hits"]))]
    assert ids == [hit["id"] for hit in expected["hits"]] and ids[0] == "lru"
    assert page.inner_text('#search-meta [data-field="embedding_level"] dd') in {"L1", "L2", "L3", "compute", "(whole result cached)"}
    assert number(shown(page, '#search-meta [data-field="timings_ms.total"]')) > 0
    page.screenshot(path=str(tmp_path / "ui.png"), full_page=True)
    assert (tmp_path / "ui.png").stat().st_size > 10_000

    # The key stays in this tab's sessionStorage and in headers: never in a URL, and nothing leaves the service.
    assert page.evaluate("sessionStorage.getItem('ragcache.ui.key')") == ADMIN_KEY
    origin = urlsplit(server.url).netloc
    assert page.requested and all(urlsplit(request.url).netloc == origin for request in page.requested)
    assert not any(ADMIN_KEY in request.url for request in page.requested)
    assert ADMIN_KEY not in page.content()


def engine_line(server) -> dict:
    """The stats' residency of prefix "engine" on the stand-in, as ``GET /prefixes/engine`` has it too."""
    view = server.admin.get("/prefixes/engine").json()
    return next(r for r in view["residency"] if r["base_url"] == server.vllm.url)


def test_the_prefix_table_shows_each_endpoints_resident_blocks_from_its_kv_events(page, server):
    # Events once the subscriber is synced (a batch before would be replayed, but waiting keeps the test about the
    # page). The blocks are counted once the first event has told the block size and a tick has the prefix's tokens.
    wait_for(lambda: engine_line(server)["events"] == "synced", "a synced subscriber")
    server.publisher.publish([stored([501, 502], None, list(range(2 * ENGINE_BLOCK)), ENGINE_BLOCK)])
    open_with_key(page, server, ADMIN_KEY)
    line = f'tr[data-prefix="engine"] [data-field="engine"] [data-endpoint="{server.vllm.url}"]'

    def page_shows(resident: int) -> bool:
        return page.locator(line).count() == 1 and page.get_attribute(line, "data-resident-blocks") == str(resident)

    wait_for(lambda: page_shows(2), "2 resident blocks")
    assert engine_line(server)["resident_blocks"] == 2
    assert page.get_attribute(line, "data-num-blocks") == "2" and page.get_attribute(line, "data-events") == "synced"
    assert page.inner_text(line).startswith(f"{server.vllm.url}: 2/2 blocks resident")
    server.publisher.publish([removed([502])])  # the engine evicts the prefix's second block
    wait_for(lambda: page_shows(1), "1 resident block after the eviction")
    assert page.inner_text(line).startswith(f"{server.vllm.url}: 1/2 blocks resident")
    # The target without events says so, on its own line.
    support = 'tr[data-prefix="support"] [data-field="engine"] [data-endpoint]'
    assert page.locator(support).count() == 1 and page.get_attribute(support, "data-events") == "off"
    assert ": no events" in page.inner_text(support)


def test_the_api_docs_render_from_this_origin_under_the_csp(page, server):
    refusals: list[str] = []
    page.on("console", lambda message: refusals.append(message.text) if "Content Security Policy" in message.text else None)
    page.goto(server.url + "/docs")
    # Swagger UI drew one block per operation of the schema, from this service's own files and schema.
    page.wait_for_selector(".opblock", timeout=WAIT_S * 1000)
    num_operations = sum(len(item) for item in httpx.get(server.url + "/openapi.json").json()["paths"].values())
    wait_for(lambda: page.locator(".opblock").count() == num_operations, "every operation")
    origin = urlsplit(server.url).netloc
    assert page.requested and all(urlsplit(request.url).netloc == origin for request in page.requested)
    assert {urlsplit(request.url).path for request in page.requested} >= {"/docs", "/docs/swagger-ui-bundle.js", "/openapi.json"}
    assert not refusals, refusals  # nothing the page needs is refused by the CSP (no inline script or style)


def run_search(page, query: str) -> None:
    page.fill("#collection", "notes")
    page.fill("#query", query)
    page.fill("#top-k", "3")
    page.click("#search-button")
    page.wait_for_selector("#hits tr[data-hit]", timeout=WAIT_S * 1000)


def test_a_key_without_admin_sees_its_own_panels_and_a_refusal_for_the_rest(page, server, tmp_path):
    open_with_key(page, server, SEARCH_KEY)
    wait_for(lambda: "Not for this key" in page.inner_text("#models-status"), "the models panel's 403")
    assert "admin" in page.inner_text("#models-status") and page.locator("[data-model]").count() == 0
    page.wait_for_selector('tr[data-prefix="support"]', timeout=WAIT_S * 1000)  # any key reads prefixes
    run_search(page, "vector database")
    assert page.get_attribute("#hits tr[data-hit]", "data-hit") == "milvus"
    page.screenshot(path=str(tmp_path / "ui-search-key.png"), full_page=True)


def test_without_a_key_the_page_loads_and_asks_for_one(page, server):
    open_with_key(page, server, None)
    wait_for(lambda: "Needs an API key" in page.inner_text("#models-status"), "the models panel's 401")
    assert "Needs an API key" in page.inner_text("#prefixes-status")
    assert page.inner_text("#health") == "ok"  # /health is open


REMOTE = "remote-model"


def answer_embeddings(request: Received) -> Reply:
    """An OpenAI-shaped upstream: a fixed vector per text (from its hash), 4 tokens a text."""
    texts = request.body["input"]
    texts = [texts] if isinstance(texts, str) else texts
    rows = [np.random.default_rng(zlib.crc32(text.encode())).standard_normal(8).astype("<f4") for text in texts]
    data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()} for i, row in enumerate(rows)]
    usage = {"prompt_tokens": 4 * len(texts), "total_tokens": 4 * len(texts)}
    return Reply(200, {"object": "list", "data": data, "model": REMOTE, "usage": usage})


def test_a_remote_model_shows_its_upstream_and_what_hits_saved(browser, redis_server, tmp_path):
    with LoopbackServer(answer_embeddings) as upstream:
        model = {"name": REMOTE, "provider": "openai", "base_url": upstream.url, "upstream_model": REMOTE, "dimensions": 8,
                 "price_per_million_tokens": 20.0, "max_retries": 0, "timeout_s": 5.0}
        keys = json.dumps({"keys": [{"name": "ops", "key": ADMIN_KEY, "scopes": "*"}]})
        settings = Settings(models_json=json.dumps({"models": [model]}), model=REMOTE, redis_url=redis_server, milvus_uri="off",
                            data_dir=tmp_path, api_keys=keys, drift_check=False)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60, headers=headers) as admin:
            for _ in range(3):
                assert admin.post("/embed", json={"inputs": ["a", "b", "c"], "model": REMOTE}).status_code == 200
            upstream_figures = admin.get("/stats").json()["models"][REMOTE]["upstream"]
            assert upstream_figures["tokens_saved"] == 24 and upstream_figures["money_saved"] > 0
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            open_with_key(page, live, ADMIN_KEY)
            section = f'[data-model="{REMOTE}"] [data-section="upstream"]'
            page.wait_for_selector(section, timeout=WAIT_S * 1000)
            for field in ("tokens_saved", "money_saved", "texts_saved", "num_calls", "num_tokens"):
                assert number(shown(page, f'{section} .tile[data-field="{field}"]')) == pytest.approx(upstream_figures[field]), field
            page.screenshot(path=str(tmp_path / "ui-upstream.png"), full_page=True)
            context.close()


def test_a_target_no_prefix_uses_is_shown_stale_not_down(page, server):
    # "support" is the only prefix on the target that is not running: once it is gone, that target's last state
    # ("down") is history, and the page says so instead of showing a live fault under "No prefix" rows.
    no_vllm = server.admin.get("/prefixes/support").json()["target"]["base_url"]
    assert server.admin.delete("/prefixes/support").status_code == 204
    open_with_key(page, server, ADMIN_KEY)
    row = f'#targets tr[data-target="{no_vllm}"]'
    wait_for(lambda: page.locator(row).count() == 1 and page.get_attribute(row, "data-stale") == "true", "the stale target")
    assert page.inner_text(f"{row} .state") == "stale: no prefix uses it"
    live = f'#targets tr[data-target="{server.vllm.url}"]'
    assert page.get_attribute(live, "data-stale") == "false" and page.inner_text(f"{live} .state") in {"up", "down"}


def test_a_service_without_keys_shows_no_key_box(browser, redis_server, tmp_path):
    with LiveServer(Settings(redis_url=redis_server, milvus_uri="off", data_dir=tmp_path)) as live:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.goto(live.url + "/ui")
        page.wait_for_selector("[data-model] .tile[data-field=texts]", timeout=WAIT_S * 1000)
        assert page.locator("#key-form").is_hidden()
        context.close()
