"""SSRF through prefixes (issue 27, item 2): a tenant's admin key may aim a prefix only at URLs the operator listed,
never one with credentials or a query, and never reads back what an upstream said. Through the real service over
HTTP, against loopback servers of the test's own: an allowed "vLLM", and an "internal service" that must never be
contacted."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from ragcache.errors import InvalidInputError
from ragcache.outbound import canonical_url
from ragcache.prefixes import PrefixRegistryConfig
from ragcache.prefixes.allow import TargetPolicy
from ragcache.settings import Settings
from tests.live_server import LiveServer
from tests.prefixes.recording_server import RecordingServer

SECRET = "internal-secret-token-0123456789"
KEYS = {"acmeops": "acme-ops-key-aaaaaaaaaaaaaaaa", "globexops": "globex-ops-key-bbbbbbbbbbbbbb"}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RecordingServer]]:
    with RecordingServer() as vllm, RecordingServer() as acme_vllm, RecordingServer() as internal, \
            RecordingServer(404, f'{{"error": "denied", "token": "{SECRET}"}}'.encode()) as leaky:
        yield {"vllm": vllm, "acme_vllm": acme_vllm, "internal": internal, "leaky": leaky}


@pytest.fixture(scope="module")
def service(servers, tmp_path_factory) -> Iterator[LiveServer]:
    keys = {"keys": [{"name": name, "key": key, "scopes": "*", "tenant": name.removesuffix("ops")} for name, key in KEYS.items()]}
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=tmp_path_factory.mktemp("targets"), api_keys=json.dumps(keys),
                        prefix_vllm_endpoints=[servers["vllm"].url], prefix_allowed_targets=[servers["leaky"].url],
                        prefix_tenant_targets={"acme": [servers["acme_vllm"].url]})
    with LiveServer(settings) as live:
        yield live


def client(service: LiveServer, name: str) -> httpx.Client:
    return httpx.Client(base_url=service.url, timeout=60, headers={"Authorization": f"Bearer {KEYS[name]}"})


def spec(name: str, base_url: str, **more) -> dict:
    return {"name": name, "text": "You answer from the context only, in one short paragraph.\n", "pinned": True,
            "target": {"base_url": base_url, "model": "tiny"}, **more}


def test_a_prefix_aimed_at_a_url_the_operator_did_not_list_is_refused_and_nothing_is_contacted(service, servers):
    internal = servers["internal"].url
    with client(service, "acmeops") as acme:
        refusals = {
            "target.base_url": acme.post("/prefixes", json=spec("to-internal", internal)),
            "endpoints": acme.post("/prefixes", json=spec("via-endpoints", servers["vllm"].url, endpoints=[internal])),
            "lmcache_controller_url": acme.post("/prefixes", json=spec("via-lmcache", servers["vllm"].url,
                                                                        lmcache_controller_url=internal)),
        }
        for field, response in refusals.items():
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["field"] == field and "RAGCACHE_PREFIX_VLLM_ENDPOINTS" in error["message"]
        assert acme.get("/prefixes").json() == []  # nothing stored either
    assert servers["internal"].requests == []  # never contacted: no /tokenize, no warm, no /metrics


@pytest.mark.parametrize("suffix, said", [("/x?x=", "query"), ("#frag", "fragment"), ("", "credentials")])
def test_a_query_a_fragment_or_credentials_in_an_allowed_url_are_refused(service, servers, suffix, said):
    url = servers["vllm"].url + suffix if said != "credentials" else servers["vllm"].url.replace("//", "//user:pw@")
    before = len(servers["vllm"].requests)
    with client(service, "acmeops") as acme:
        response = acme.post("/prefixes", json=spec("odd-url", url))
    assert response.status_code == 422 and response.json()["error"]["field"] == "target.base_url"
    assert said in response.json()["error"]["message"]
    assert len(servers["vllm"].requests) == before


def test_a_tenants_own_targets_are_its_own(service, servers):
    with client(service, "acmeops") as acme, client(service, "globexops") as globex:
        assert acme.post("/prefixes", json=spec("own", servers["acme_vllm"].url)).status_code == 201
        refused = globex.post("/prefixes", json=spec("own", servers["acme_vllm"].url))
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "target.base_url"
        # A spelling of a listed URL (case, trailing slash) is that URL.
        listed = servers["vllm"].url.replace("http://", "HTTP://") + "/"
        registered = globex.post("/prefixes", json=spec("shared", listed))
        assert registered.status_code == 201 and registered.json()["prefix"]["target"]["base_url"] == servers["vllm"].url
        assert acme.delete("/prefixes/own").status_code == 204 and globex.delete("/prefixes/shared").status_code == 204
    assert ("POST", "/v1/completions") in servers["acme_vllm"].requests


def test_an_upstreams_error_body_never_reaches_the_tenant_or_the_log(service, servers, caplog):
    with client(service, "acmeops") as acme:
        registered = acme.post("/prefixes", json=spec("leaky", servers["leaky"].url))
        warmed = acme.post("/prefixes/leaky/warm")
        stats = acme.get("/prefixes/leaky/stats")
        acme.delete("/prefixes/leaky")
    assert registered.status_code == 201 and servers["leaky"].requests  # it was allowed, and contacted
    warm = warmed.json()
    assert warm["outcome"] in ("error", "skipped") and "answered HTTP 404" in (registered.json()["warm"]["error"] or "")
    for text in (registered.text, warmed.text, stats.text, caplog.text):
        assert SECRET not in text and "denied" not in text


def test_the_policy_canonicalises_and_refuses_what_a_url_should_not_carry():
    assert canonical_url("HTTP://VLLM.internal:8000/", "f") == "http://vllm.internal:8000"
    for bad in ("ftp://x", "http://", "http://u@x", "http://x/?a=1", "http://x#y", "http://x\\y", "http://x:port", " http://x"):
        with pytest.raises(InvalidInputError):
            canonical_url(bad, "f")
    policy = TargetPolicy(PrefixRegistryConfig(restrict_targets=True, endpoints=("http://a:1",),
                                               tenant_targets={"acme": ("http://b:2",)}))
    assert policy.allows("http://a:1", None) and policy.allows("http://b:2", "acme")
    assert not policy.allows("http://b:2", "globex") and not policy.allows("http://c:3", "acme")
    assert TargetPolicy(PrefixRegistryConfig()).allows("http://c:3", None)  # the library's default: the caller is the operator
