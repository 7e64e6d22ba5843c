"""API keys, scopes, tenants and the bind refusal, against the real service (real Redis, Milvus Lite, model)."""

import hashlib
import json
import re
import uuid

import httpx
import numpy as np
import pytest

from ragcache.errors import ConfigError
from ragcache.settings import Settings
from ragcache.storage.embedded_redis import free_port
from ragcache_cli.cli import main
from ragcache_server.app import create_app
from ragcache_server.auth import (
    FAILED_AUTH_BURST,
    OPEN_PATHS,
    ROUTE_SCOPES,
    SCOPES,
    AccessMiddleware,
    ApiKey,
    KeyRing,
    required_scope,
    route_table,
)
from ragcache_server.limits import RateLimiter
from ragcache_server.routes_ui import HEADERS as UI_HEADERS
from ragcache_server.serving import proxy_options
from tests.errors import error_of
from tests.live_server import LiveServer
from tests.server.test_limits import Clock, asgi_messages

LEGACY = "legacy-single-key-0123456789"
# Where the tests' prefixes point: nothing listens there (warms fail), and the operator lists it (a service with API
# keys calls no URL it was not given: RAGCACHE_PREFIX_ALLOWED_TARGETS, docs/SECURITY.md).
NO_VLLM = f"http://127.0.0.1:{free_port()}"
KEYS = {
    "ops": "ops-key-aaaaaaaaaaaaaaaa",
    "embedder": "embed-only-bbbbbbbbbbbbbb",
    "acme": "acme-key-cccccccccccccccc",
    "globex": "globex-key-dddddddddddddd",
    "metered": "metered-key-eeeeeeeeeeeee",
    "acmeops": "acme-ops-key-ffffffffffffff",
    "globexops": "globex-ops-key-gggggggggggg",
}


def key_file(tmp_path):
    sha = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    document = {
        "keys": [
            {"name": "ops", "sha256": sha(KEYS["ops"]), "scopes": "*"},
            {"name": "embedder", "key": KEYS["embedder"], "scopes": ["embed"]},
            {"name": "acme", "sha256": sha(KEYS["acme"]), "scopes": ["embed", "search", "ingest"], "tenant": "acme"},
            {"name": "globex", "sha256": sha(KEYS["globex"]), "scopes": ["embed", "search", "ingest"], "tenant": "globex"},
            # 2 requests, then one token per 100 s: the third is refused however slow the machine is.
            {"name": "metered", "sha256": sha(KEYS["metered"]), "scopes": ["embed"], "rate_limit_per_s": 0.01, "rate_limit_burst": 2},
            # A tenant's own operators: every scope, within the tenant (its prefixes, its collections).
            {"name": "acmeops", "key": KEYS["acmeops"], "scopes": "*", "tenant": "acme"},
            {"name": "globexops", "key": KEYS["globexops"], "scopes": "*", "tenant": "globex"},
        ]
    }
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(document))
    return path


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("access")
    settings = Settings(
        redis_url=redis_server, data_dir=folder, api_key=LEGACY, api_keys_file=key_file(folder), tenant_cache_namespaces=True,
        prefix_allowed_targets=[NO_VLLM],
    )
    with LiveServer(settings) as live:
        yield live


def client(server, name):
    key = LEGACY if name == "legacy" else KEYS[name]
    return httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def clients(server):
    made = {name: client(server, name) for name in [*KEYS, "legacy"]}
    yield made
    for made_client in made.values():
        made_client.close()


def test_every_route_has_a_scope_or_is_open():
    app = create_app(Settings(redis_url="off", milvus_uri="off"))
    routes = {(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item}
    unlisted = {route for route in routes if route not in ROUTE_SCOPES and route[1] not in OPEN_PATHS}
    assert not unlisted
    assert set(ROUTE_SCOPES) <= routes  # the table names no route that is gone
    table = route_table(sorted(routes))
    assert required_scope(table, "DELETE", "/prefixes/system-v2") == "admin"
    assert required_scope(table, "POST", "/prefixes/system-v2/uses") == "search"
    assert required_scope(table, "GET", "/no-such-route") == "any key"  # the app answers 404
    assert required_scope(route_table([("POST", "/flush")]), "POST", "/flush") == "admin"  # unlisted: closed


def test_scopes_hold_behind_a_root_path():
    """With ``uvicorn --root-path /api`` the path holds the prefix; the router strips it, so must the check."""

    async def ok_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    keys = KeyRing.from_settings(Settings(api_keys=json.dumps({"keys": [{"name": "e", "key": KEYS["embedder"], "scopes": ["embed"]}]})))
    middleware = AccessMiddleware(ok_app, keys=keys, limiter=RateLimiter(None, None), routes=[("GET", "/stats"), ("GET", "/health")])
    bearer = [(b"authorization", f"Bearer {KEYS['embedder']}".encode())]
    for path, headers, status in (("/api/stats", bearer, 403), ("/api/health", [], 200)):
        scope = {"method": "GET", "path": path, "root_path": "/api", "headers": headers}
        assert asgi_messages(middleware, scope)[0]["status"] == status, path


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-key"}, {"Authorization": f"Basic {KEYS['ops']}"}])
def test_a_missing_or_wrong_key_is_a_json_401(server, headers):
    response = httpx.post(server.url + "/embed", json={"inputs": "x"}, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = error_of(response)
    assert error["type"] == "unauthorized" and "Authorization: Bearer" in error["message"]


def test_a_wrong_key_is_refused_before_its_body_is_read(server):
    response = httpx.post(server.url + "/embed", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 401


def test_open_paths_need_no_key(server):
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/openapi.json").json()["info"]["title"] == "ragcache"
    assert httpx.get(server.url + "/docs").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 401  # the operator's: see docs/SECURITY.md
    # The dashboard's page and assets hold no data (its calls carry the key); only those exact paths are open.
    page = httpx.get(server.url + "/ui")
    assert page.status_code == 200 and "connect-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(server.url + "/ui/ui.js").headers["content-type"].startswith("text/javascript")
    assert httpx.get(server.url + "/ui/ui.css").status_code == 200
    assert httpx.get(server.url + "/ui/../stats").status_code == 401
    assert httpx.get(server.url + "/ui/other.js").status_code == 401


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/search", {"collection": "c", "query": "x"}),
        ("GET", "/collections", None),
        ("POST", "/documents", {"collection": "c", "documents": [{"id": "a", "text": "a"}]}),
        ("DELETE", "/documents", {"collection": "c", "ids": ["a"]}),
        ("POST", "/prefixes", {"name": "p", "text": "t"}),
        ("DELETE", "/prefixes/p", None),
        ("GET", "/stats", None),
        ("GET", "/metrics", None),
    ],
)
def test_a_key_without_the_scope_is_a_json_403(clients, method, path, body):
    response = clients["embedder"].request(method, path, json=body)
    assert response.status_code == 403, response.text
    error = error_of(response)
    assert error["type"] == "forbidden" and "embedder" in error["message"] and f"{method} {path}" in error["message"]
    assert KEYS["embedder"] not in response.text


def test_each_scope_opens_its_routes(clients):
    assert clients["embedder"].post("/embed", json={"inputs": "x"}).status_code == 200
    assert clients["embedder"].post("/v1/embeddings", json={"input": "x"}).status_code == 200
    assert clients["embedder"].get("/info").status_code == 200  # any key
    assert clients["embedder"].get("/prefixes").status_code == 403  # prompts are built by retrieval clients
    assert clients["acme"].get("/prefixes").status_code == 200
    assert clients["acme"].delete("/prefixes/nope").status_code == 403  # admin only
    for name in ("ops", "legacy"):
        assert clients[name].get("/stats").status_code == 200
        assert "ragcache_hits_total" in clients[name].get("/metrics").text
        assert clients[name].delete("/prefixes/no-such-prefix").status_code == 404  # allowed, then not found


def test_a_tenant_sees_and_searches_only_its_own_collections(clients):
    name = "docs_" + uuid.uuid4().hex[:6]
    acme_docs = [{"id": "a1", "text": "Acme's secret roadmap: rockets", "metadata": {"owner": "acme"}}]
    globex_docs = [{"id": "g1", "text": "Globex quarterly numbers", "metadata": {"owner": "globex"}}]
    assert clients["acme"].post("/documents", json={"collection": name, "documents": acme_docs}).json()["collection"] == name
    assert clients["globex"].post("/documents", json={"collection": name, "documents": globex_docs}).status_code == 200
    acme_only = "private_" + uuid.uuid4().hex[:6]
    assert clients["acme"].post("/documents", json={"collection": acme_only, "documents": acme_docs}).status_code == 200

    for tenant, expected in (("acme", "a1"), ("globex", "g1")):
        hits = clients[tenant].post("/search", json={"collection": name, "query": "rockets", "top_k": 10}).json()["hits"]
        assert [hit["id"] for hit in hits] == [expected]
    # Keyword search sees the tenant's own collection only: "rockets" is in acme's text, not globex's.
    for tenant, expected in (("acme", ["a1"]), ("globex", [])):
        body = {"collection": name, "query": "rockets", "top_k": 10, "mode": "keyword"}
        assert [hit["id"] for hit in clients[tenant].post("/search", json=body).json()["hits"]] == expected
    listed = {c["name"] for c in clients["globex"].get("/collections").json()["collections"]}
    assert name in listed and acme_only not in listed and not any("--" in n for n in listed)

    # Another tenant's collection does not exist for globex: 404, and the message names only what it sent.
    response = clients["globex"].post("/search", json={"collection": acme_only, "query": "rockets"})
    assert response.status_code == 404
    assert "acme" not in error_of(response)["message"] and acme_only in error_of(response)["message"]
    # The operator (no tenant) sees the stored names.
    stored = {c["name"] for c in clients["ops"].get("/collections").json()["collections"]}
    assert {f"acme--{name}", f"globex--{name}", f"acme--{acme_only}"} <= stored


def test_prefixes_are_per_tenant_and_their_uses_bounded(clients):
    # vLLM is not running: registering still works (its warm fails), which is all this needs.
    target = {"base_url": NO_VLLM, "model": "tiny"}
    texts = {"acme": "You are Acme's assistant: rockets only.\n\n", "globex": "You are Globex's assistant.\n\n"}
    for tenant, text in texts.items():
        created = clients[f"{tenant}ops"].post("/prefixes", json={"name": "system", "text": text, "target": target})
        assert created.status_code == 201, created.text  # the same name twice: each tenant's own
        assert created.json()["prefix"]["name"] == "system" and created.json()["warm"]["name"] == "system"
    for tenant, text in texts.items():
        assert clients[tenant].get("/prefixes/system").json()["text"] == text
        assert [(p["name"], p["text"]) for p in clients[tenant].get("/prefixes").json()] == [("system", text)]
    # Another tenant's prefix does not exist for acme, not even by its stored name: 404 for every operation.
    acme, acmeops = clients["acme"], clients["acmeops"]
    assert acme.get("/prefixes/globex--system").status_code == 404
    assert acme.get("/prefixes/globex--system/stats").status_code == 404
    assert acme.post("/prefixes/globex--system/uses", json={"count": 1}).status_code == 404
    assert acmeops.post("/prefixes/globex--system/warm").status_code == 404
    assert acmeops.delete("/prefixes/globex--system").status_code == 404
    missing = acme.get("/prefixes/nope")
    assert missing.status_code == 404 and "'nope'" in missing.text and "acme--" not in missing.text
    # A search builds its prompt from the caller's own prefix.
    collection = "prompts_" + uuid.uuid4().hex[:6]
    for tenant in texts:
        documents = [{"id": "d1", "text": f"{tenant} handbook"}]
        assert clients[tenant].post("/documents", json={"collection": collection, "documents": documents}).status_code == 200
        body = {"collection": collection, "query": "handbook", "prompt_prefix": "system"}
        assert clients[tenant].post("/search", json=body).json()["prompt"].startswith(texts[tenant])
    # Uses: at most 100,000 a report (a billion in one call was taken), counted for the tenant's prefix only.
    refused = acme.post("/prefixes/system/uses", json={"count": 10**9})
    assert refused.status_code == 422 and error_of(refused)["field"] == "count"
    assert acme.post("/prefixes/system/uses", json={"count": 100_000}).status_code == 204
    assert acme.get("/prefixes/system/stats").json()["num_uses"] == 100_001  # and the search's prompt
    assert clients["globex"].get("/prefixes/system/stats").json()["num_uses"] == 1
    # Reading prefixes and reporting uses is retrieval: an embed-only key may do neither.
    assert clients["embedder"].get("/prefixes/acme--system").status_code == 403
    assert clients["embedder"].post("/prefixes/acme--system/uses", json={"count": 1}).status_code == 403
    # The operator (no tenant) sees the stored names.
    assert {"acme--system", "globex--system"} <= {p["name"] for p in clients["ops"].get("/prefixes").json()}
    for tenant in texts:
        assert clients[f"{tenant}ops"].delete("/prefixes/system").status_code == 204


def test_a_tenants_prefix_is_never_named_by_its_stored_or_another_tenants_name(clients):
    """Every answer and error a tenant reads about its prefixes (register, read, list, warm, uses, stats, /stats,
    /search's prompt_prefix) names them as the tenant does: no 'acme--', nothing of globex's."""
    target = {"base_url": NO_VLLM, "model": "tiny"}  # no vLLM: warms fail, names still show
    guide, qa = "guide_" + uuid.uuid4().hex[:6], "qa_" + uuid.uuid4().hex[:6]
    acme, acmeops = clients["acme"], clients["acmeops"]
    answers = [acmeops.post("/prefixes", json={"name": guide, "text": "You are Acme's guide.\n\n", "target": target})]
    answers.append(acmeops.post("/prefixes", json={"name": qa, "text": "Acme asks: {question}", "target": target, "is_template": True}))
    assert clients["globexops"].post("/prefixes", json={"name": guide, "text": "Globex's.", "target": target}).status_code == 201
    answers += [acme.get(f"/prefixes/{guide}"), acme.get("/prefixes"), acmeops.post(f"/prefixes/{guide}/warm"),
                acme.post(f"/prefixes/{guide}/uses", json={"count": 2}), acme.get(f"/prefixes/{guide}/stats")]
    assert [answer.status_code for answer in answers] == [201, 201, 200, 200, 200, 204, 200], [a.text for a in answers]
    assert answers[0].json()["prefix"]["name"] == guide and {w["name"] for w in answers[0].json()["warms"]} == {guide}
    assert answers[2].json()["name"] == guide and answers[4].json()["name"] == guide
    assert sorted(p["name"] for p in answers[3].json()) == sorted([guide, qa])
    assert answers[6].json()["name"] == guide and answers[6].json()["num_uses"] == 2
    # /stats with a tenant's admin key: its own prefixes only, by their public names.
    stats = acmeops.get("/stats").json()["prefixes"]
    assert {guide, qa} <= {item["name"] for item in stats["prefixes"]}
    answers.append(httpx.Response(200, json=stats))

    collection = "names_" + uuid.uuid4().hex[:6]
    assert acme.post("/documents", json={"collection": collection, "documents": [{"id": "d", "text": "guide"}]}).status_code == 200
    errors = {
        (404, None): acme.get("/prefixes/nope"),
        (404, "globex"): acme.get(f"/prefixes/globex--{guide}/stats"),
        (404, "uses"): acme.post("/prefixes/nope/uses", json={"count": 1}),
        (404, "delete"): acmeops.delete("/prefixes/nope"),
        (404, "warm"): acmeops.post("/prefixes/nope/warm"),
        (422, "endpoint"): acmeops.post(f"/prefixes/{guide}/warm", params={"endpoint": "http://127.0.0.1:9"}),
        (422, "name"): acmeops.post("/prefixes", json={"name": "n" * 124, "text": "t", "target": target}),
        (404, "prompt_prefix"): acme.post("/search", json={"collection": collection, "query": "q", "prompt_prefix": "nope"}),
        (422, "template"): acme.post("/search", json={"collection": collection, "query": "q", "prompt_prefix": qa}),
        (422, "invalid"): acme.post("/search", json={"collection": collection, "query": "q", "prompt_prefix": "-x"}),
    }
    for (status, case), response in errors.items():
        assert response.status_code == status, (case, response.text)
    assert f"'{guide}' is not served by" in errors[(422, "endpoint")].text
    assert "at most 122 characters" in errors[(422, "name")].text
    assert error_of(errors[(422, "invalid")])["field"] == "prompt_prefix"
    for response in [*answers, *errors.values()]:
        text = response.text.replace(f"globex--{guide}", "")  # the one name acme itself sent
        assert "acme--" not in text and "globex" not in text.lower(), response.text
    # The operator (no tenant) sees every prefix, under its stored name.
    stored = {item["name"] for item in clients["ops"].get("/stats").json()["prefixes"]["prefixes"]}
    assert {f"acme--{guide}", f"acme--{qa}", f"globex--{guide}"} <= stored
    for ops, name in (("acmeops", guide), ("acmeops", qa), ("globexops", guide)):
        assert clients[ops].delete(f"/prefixes/{name}").status_code == 204


def test_the_api_docs_load_nothing_from_another_origin(server):
    page = httpx.get(server.url + "/docs")
    assert page.status_code == 200 and page.headers["content-security-policy"] == UI_HEADERS["Content-Security-Policy"]
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(sources) == ["docs/docs.js", "docs/swagger-ui-bundle.js", "docs/swagger-ui.css"]  # relative: this origin
    assert "<script>" not in page.text  # no inline script: the CSP would refuse it
    for source in sources:
        asset = httpx.get(f"{server.url}/{source}")
        assert asset.status_code == 200 and asset.headers["content-security-policy"] == page.headers["content-security-policy"]
    start = httpx.get(server.url + "/docs/docs.js").text
    assert '"openapi.json"' in start and "validatorUrl: null" in start and "http" not in start
    assert httpx.get(server.url + "/openapi.json").json()["paths"]["/search/batch"]
    # FastAPI's CDN pages are gone, so their paths are no longer open.
    for path in ("/redoc", "/docs/oauth2-redirect"):
        assert httpx.get(server.url + path).status_code == 401


@pytest.mark.parametrize(
    "expression",
    [
        'metadata["owner"] == "globex" or metadata["owner"] == "acme"',
        'metadata["owner"] == "x" or true',
        'metadata["owner"] == "x") or (1 == 1',
        'metadata["owner"] == "x\\" or id != \\""',
        'id != ""',
        'text like "%"',
        'kb_acme____docs.text like "%"',
    ],
)
def test_a_filter_cannot_reach_another_tenants_documents(clients, expression):
    name = "filters_" + uuid.uuid4().hex[:6]
    clients["acme"].post("/documents", json={
        "collection": name, "documents": [{"id": "a", "text": "acme secret", "metadata": {"owner": "acme"}}]})
    clients["globex"].post("/documents", json={
        "collection": name, "documents": [{"id": "g", "text": "globex text", "metadata": {"owner": "globex"}}]})
    for mode in ("dense", "keyword", "hybrid"):  # BM25 ("secret" is in acme's text only) as much as vectors
        body = {"collection": name, "query": "secret", "top_k": 10, "filter": expression, "mode": mode}
        response = clients["globex"].post("/search", json=body)
        assert response.status_code in (200, 422), response.text
        if response.status_code == 200:
            assert {hit["id"] for hit in response.json()["hits"]} <= {"g"}
        else:
            assert error_of(response)["field"] == "filter"


def test_tenant_cache_namespaces_keep_hits_apart(clients):
    text = f"a text only acme has embedded [{uuid.uuid4().hex}]"
    first = clients["acme"].post("/embed", json={"inputs": [text]})
    assert first.headers["x-cache-compute"] == "1"
    assert clients["acme"].post("/embed", json={"inputs": [text]}).headers["x-cache-l1"] == "1"
    # globex cannot tell that acme embedded it: a miss everywhere, computed again.
    other = clients["globex"].post("/embed", json={"inputs": [text]})
    assert other.headers["x-cache-compute"] == "1" and other.headers["x-cache-l1"] == "0"
    np.testing.assert_allclose(other.json(), first.json(), atol=1e-5)  # the same model, the same vector
    shared = clients["embedder"].post("/embed", json={"inputs": [text]})  # no tenant: the shared namespace
    assert shared.headers["x-cache-compute"] == "1"
    # One cache serves every tenant: its figures count all of them, and /stats splits them per namespace.
    (model,) = clients["ops"].get("/stats").json()["models"].values()
    namespaces = model["namespaces"]
    assert {"acme", "globex"} <= set(namespaces) and namespaces["acme"]["since_start"]["hits"] >= 1
    assert namespaces["globex"]["since_start"]["texts"] >= 1
    assert model["since_start"]["texts"] >= sum(n["since_start"]["texts"] for n in namespaces.values())


def test_a_tenants_admin_key_reads_its_own_figures_only(clients):
    """The totals, level states and other namespaces count every tenant's traffic (audit round four, Low 7)."""
    text = f"a text only globex has embedded [{uuid.uuid4().hex}]"
    assert clients["globex"].post("/embed", json={"inputs": [text]}).status_code == 200
    assert clients["acme"].post("/embed", json={"inputs": [f"acme's own [{uuid.uuid4().hex}]"]}).status_code == 200
    answer = clients["acmeops"].get("/stats")
    assert answer.status_code == 200, answer.text
    (model,) = answer.json()["models"].values()
    assert set(model) == {"tenant", "since_start", "recent"} and model["tenant"] == "acme"
    assert model["since_start"]["texts"] >= 1
    assert "globex" not in answer.text and answer.json()["rerankers"] == {}
    refused = clients["acmeops"].get("/metrics")
    assert refused.status_code == 403 and error_of(refused)["type"] == "forbidden"
    assert "ragcache_hits_total" in clients["ops"].get("/metrics").text  # the operator's key still reads them



def test_rate_limit_per_key_is_a_429_with_retry_after(clients):
    statuses = [clients["metered"].post("/embed", json={"inputs": "x"}) for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    refused = statuses[-1]
    assert 1 <= int(refused.headers["retry-after"]) <= 100
    assert error_of(refused)["type"] == "rate_limited" and "metered" in error_of(refused)["message"]
    assert clients["embedder"].post("/embed", json={"inputs": "x"}).status_code == 200  # other keys unaffected


def test_key_files_in_toml_and_environment_json(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(
        '[[keys]]\nname = "reader"\nkey = "reader-key-0123456789"\nscopes = ["search"]\ntenant = "t1"\n'
        f'[[keys]]\nname = "writer"\nsha256 = "{hashlib.sha256(b"writer-key").hexdigest()}"\nscopes = ["ingest"]\n'
    )
    env_keys = json.dumps({"keys": [{"name": "env", "key": "env-key-0123456789ab", "scopes": ["admin"]}]})
    ring = KeyRing.from_settings(Settings(api_keys_file=path, api_keys=env_keys, redis_url="off"))
    assert ring.find("reader-key-0123456789").tenant == "t1"
    assert ring.find("writer-key").scopes == frozenset({"ingest"})
    assert ring.find("env-key-0123456789ab").name == "env"
    assert ring.find("writer-key ") is None and ring.find("") is None
    assert KeyRing.from_settings(Settings(api_key=LEGACY, redis_url="off")).find(LEGACY).scopes == frozenset(SCOPES)


def test_a_short_legacy_key_is_refused_at_start():
    with pytest.raises(ConfigError, match="RAGCACHE_API_KEY must be at least 16 characters"):
        KeyRing.from_settings(Settings(api_key="k3y", redis_url="off"))


def test_failed_authentication_is_rate_limited_per_client_address():
    """Past its budget of wrong keys an address gets 429 before its key is looked at, so a guesser learns
    nothing more from it, even with the right key; other addresses are unaffected."""

    async def ok_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    keys = KeyRing.from_settings(Settings(api_key=LEGACY, redis_url="off"))
    failures = RateLimiter(0.01, 2, clock=Clock())
    middleware = AccessMiddleware(ok_app, keys=keys, limiter=RateLimiter(None, None), routes=[], failed_auth=failures)

    def status_for(address, key):
        headers = [(b"authorization", f"Bearer {key}".encode())]
        first = asgi_messages(middleware, {"client": (address, 5000), "headers": headers})[0]
        return first["status"], dict(first["headers"]).get(b"retry-after")

    assert status_for("10.0.0.1", LEGACY) == (200, None)
    assert status_for("10.0.0.1", "wrong-key") == (401, None)
    assert status_for("10.0.0.1", "wrong-key") == (401, None)
    assert status_for("10.0.0.1", "wrong-key") == (429, b"100")
    assert status_for("10.0.0.1", LEGACY) == (429, b"100")
    assert status_for("10.0.0.2", "wrong-key") == (401, None)
    assert status_for("10.0.0.2", LEGACY) == (200, None)


def test_a_forged_x_forwarded_for_gets_no_fresh_budget_of_wrong_keys(tmp_path):
    """uvicorn believes X-Forwarded-For from 127.0.0.1 by default, so a local guesser sending a new one with each
    wrong key was a new client each time (audit round four, Low 11). With no trusted proxy listed, the connection's
    own address counts: past the budget, 429 whatever the header says."""
    settings = Settings(api_key=LEGACY, redis_url="off", milvus_uri="off", data_dir=tmp_path)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        # Each forged address is new: counted by it, none would ever run out of budget (the old code: all 401).
        forged = [{"Authorization": "Bearer wrong-key", "X-Forwarded-For": f"10.9.{n // 200}.{n % 200}"}
                  for n in range(4 * FAILED_AUTH_BURST)]
        statuses = [http.get("/stats", headers=headers).status_code for headers in forged]
    assert set(statuses) == {401, 429} and statuses[:FAILED_AUTH_BURST] == [401] * FAILED_AUTH_BURST, statuses


def test_forwarded_addresses_are_believed_only_from_listed_proxies():
    assert proxy_options([]) == {"proxy_headers": False}
    assert proxy_options(["10.0.0.0/8"]) == {"proxy_headers": True, "forwarded_allow_ips": ["10.0.0.0/8"]}
    with pytest.raises(ValueError):
        Settings(trusted_proxies="10.0.0.1")  # a list, as JSON in the environment: ["10.0.0.1"]


def test_no_key_never_matches_and_keys_never_show_in_the_settings_repr():
    settings = Settings(api_key="the-legacy-secret", api_keys='{"keys": []}', redis_url="off")
    assert KeyRing([ApiKey("odd", hashlib.sha256(b"").digest(), frozenset(SCOPES))]).find("") is None
    assert "the-legacy-secret" not in repr(settings) and '{"keys": []}' not in repr(settings)


@pytest.mark.parametrize(
    "entry, complaint",
    [
        ({"name": "a", "key": "short", "scopes": ["embed"]}, "at least 16"),
        ({"name": "a", "sha256": "zz", "scopes": ["embed"]}, "64 hex"),
        ({"name": "a", "sha256": hashlib.sha256(b"").hexdigest(), "scopes": ["embed"]}, "empty string"),
        ({"name": "a", "key": "k" * 16, "sha256": "0" * 64, "scopes": ["embed"]}, "exactly one"),
        ({"name": "a", "key": "k" * 16, "scopes": ["root"]}, "scopes"),
        ({"name": "a", "key": "k" * 16, "scopes": ["embed"], "tenant": "a-b"}, "tenant"),
        ({"name": "a", "key": "k" * 16, "scopes": ["embed"], "rate_limit_per_s": -1}, "rate_limit_per_s"),
        ({"key": "k" * 16, "scopes": ["embed"]}, "name"),
        ({"name": "a", "key": "k" * 16, "scopes": ["embed"], "role": "x"}, "unknown"),
    ],
)
def test_a_bad_key_file_stops_the_start_with_a_clear_message(tmp_path, entry, complaint):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [entry]}))
    with pytest.raises(ConfigError, match=complaint):
        create_app(Settings(api_keys_file=path, redis_url="off"))


def test_an_empty_key_list_stops_the_start_instead_of_opening_the_service(tmp_path):
    # A key source was given, so the bind check lets the service listen beyond loopback: no keys must not mean open.
    path = tmp_path / "keys.toml"
    path.write_text("keys = []\n")
    with pytest.raises(ConfigError, match="non-empty list"):
        create_app(Settings(api_keys_file=path, redis_url="off"))
    with pytest.raises(ConfigError, match="non-empty list"):
        create_app(Settings(api_keys='{"keys": []}', redis_url="off"))
    assert Settings(api_keys='{"keys": []}', redis_url="off").access.bind_refusal("0.0.0.0") is None


def test_binding_beyond_loopback_needs_keys_or_insecure(monkeypatch, capsys):
    for name in ("RAGCACHE_API_KEY", "RAGCACHE_API_KEYS", "RAGCACHE_API_KEYS_FILE", "RAGCACHE_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    open_settings = Settings(redis_url="off")
    assert open_settings.access.bind_refusal("127.0.0.1") is None and open_settings.access.bind_refusal("localhost") is None
    assert "RAGCACHE_API_KEY" in open_settings.access.bind_refusal("0.0.0.0")
    assert open_settings.access.bind_refusal("::") and open_settings.access.bind_refusal("10.1.2.3")
    assert Settings(redis_url="off", insecure=True).access.bind_refusal("0.0.0.0") is None
    assert Settings(redis_url="off", api_key="k").access.bind_refusal("0.0.0.0") is None
    # The command refuses before it starts anything.
    assert main(["serve", "--host", "0.0.0.0", "--port", "9"]) == 1
    assert "--insecure" in capsys.readouterr().err
