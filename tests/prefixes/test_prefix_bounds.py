"""Prefix storage is bounded (issue 27, item 5): a prefix's text, the prefixes of one tenant and its registrations in
a minute, through the real service on a real Redis, with tenants' admin keys. Before, a tenant stored prefixes of any
size (up to the 16 MiB body) in any number, at any rate, in a Redis hash with no TTL."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis

from ragcache.settings import Settings
from tests.live_server import LiveServer
from tests.prefixes.recording_server import RecordingServer

TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")
MAX_TEXT_BYTES = 1000
MAX_PER_TENANT = 3
REGISTRATIONS_PER_MINUTE = 8


@pytest.fixture(scope="module")
def vllm() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


@pytest.fixture(scope="module")
def service(vllm, redis_server, tmp_path_factory) -> Iterator[LiveServer]:
    keys = {"keys": [{"name": tenant, "key": f"{tenant}-ops-key-0123456789", "scopes": "*", "tenant": tenant} for tenant in TENANTS]}
    settings = Settings(redis_url=redis_server, milvus_uri="off", data_dir=tmp_path_factory.mktemp("bounds"),
                        api_keys=json.dumps(keys), prefix_vllm_endpoints=[vllm.url], prefix_max_text_bytes=MAX_TEXT_BYTES,
                        prefix_max_per_tenant=MAX_PER_TENANT, prefix_registrations_per_minute=REGISTRATIONS_PER_MINUTE)
    with LiveServer(settings) as live:
        yield live


def client(service: LiveServer, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=service.url, timeout=60, headers={"Authorization": f"Bearer {tenant}-ops-key-0123456789"})


def register(http: httpx.Client, vllm: RecordingServer, name: str, text: str = "You answer from the context only.\n"):
    spec = {"name": name, "text": text, "pinned": False, "target": {"base_url": vllm.url, "model": "tiny"}}
    return http.post("/prefixes", json=spec)


def test_a_prefix_text_over_the_bound_is_a_413_and_nothing_is_stored(service, vllm, redis_server):
    text = "é" * (MAX_TEXT_BYTES // 2 + 1)  # 501 characters, 1002 UTF-8 bytes: the bound is in bytes
    with client(service, "initech") as initech:
        refused = register(initech, vllm, "big", text)
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["field"]) == ("too_large", "text") and "1002 bytes" in error["message"]
        assert register(initech, vllm, "fits", "é" * (MAX_TEXT_BYTES // 2)).status_code == 201
        stored = redis.Redis.from_url(redis_server)
        assert not stored.hexists("rc:prefixes", "initech--big") and stored.hexists("rc:prefixes", "initech--fits")
        assert initech.delete("/prefixes/fits").status_code == 204


def test_a_tenant_has_at_most_its_prefixes_and_another_tenant_is_not_counted(service, vllm):
    with client(service, "acme") as acme, client(service, "globex") as globex:
        for i in range(MAX_PER_TENANT):
            assert register(acme, vllm, f"p{i}").status_code == 201
        refused = register(acme, vllm, "one-more")
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["type"] == "quota_exceeded" and f"at most {MAX_PER_TENANT}" in refused.json()["error"]["message"]
        assert register(acme, vllm, "p0", "A new version of an existing prefix.\n").status_code == 200  # not one more
        assert register(globex, vllm, "p0").status_code == 201  # globex's count is its own
        assert acme.delete("/prefixes/p1").status_code == 204
        assert register(acme, vllm, "one-more").status_code == 201  # room again
        assert sorted(p["name"] for p in acme.get("/prefixes").json()) == ["one-more", "p0", "p2"]
        for name in ("one-more", "p0", "p2"):
            acme.delete(f"/prefixes/{name}")
        globex.delete("/prefixes/p0")


def test_registrations_over_the_rate_are_a_429_with_retry_after_for_that_tenant_only(service, vllm):
    with client(service, "umbrella") as umbrella, client(service, "initech") as initech:
        answers = [register(umbrella, vllm, "same", f"Version {i}.\n").status_code for i in range(REGISTRATIONS_PER_MINUTE)]
        assert answers == [201] + [200] * (REGISTRATIONS_PER_MINUTE - 1)  # re-registrations count too
        refused = register(umbrella, vllm, "same", "Once more.\n")
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1
        assert register(initech, vllm, "own-minute").status_code == 201  # initech's minute is its own
        initech.delete("/prefixes/own-minute")
        umbrella.delete("/prefixes/same")


def test_a_tenants_route_names_the_endpoint_and_the_reason_only(service, vllm):
    """Issue 38, item 10: the candidates' figures (other tenants' prefix blocks on each replica, the engine's total
    blocks and load) are the fleet's; a tenant's key reads where to send its request and why, nothing else."""
    with client(service, "hooli") as hooli:
        assert register(hooli, vllm, "routed").status_code == 201
        answer = hooli.post("/prefixes/routed/route")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"name": "routed", "endpoint": vllm.url, "reason": "round_robin", "candidates": []}
        assert hooli.delete("/prefixes/routed").status_code == 204
