"""Prometheus and Grafana: latency histograms in /metrics, the Prometheus config, the Grafana dashboard.

The dashboard is checked against what a real service exports (scraped over HTTP), so a panel cannot query a
metric that does not exist; the exposition and the config are checked by Prometheus' own ``promtool``
(Debian's ``prometheus`` package, installed by ``make test``: mk/system.mk).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ragcache.app.metrics import CacheCollector
from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.core.stats import LATENCY_BUCKETS_S, LevelRecorder
from ragcache.settings import Settings
from ragcache.storage.disk_store import DiskStore
from ragcache.storage.processes import free_port, stop_process, wait_healthy
from ragcache.tiers import MemoryTier
from ragcache.tiers.disk import DiskTier
from tests.fakes import HashEncoder
from tests.live_server import LiveServer

MONITORING = Path(__file__).resolve().parents[2] / "docker" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "ragcache.json"
# Series Prometheus makes itself for every scrape target, not the service.
PROMETHEUS_SERIES = {"up"}
METRIC_NAME = re.compile(r"\b(ragcache_[a-z0-9_]+|up)\b")


def promtool() -> str:
    executable = shutil.which("promtool")
    if executable is None:
        pytest.fail("promtool is not installed (apt-get install prometheus; make test does: mk/system.mk)")
    return executable


@pytest.fixture(scope="module")
def service(redis_server, tmp_path_factory):
    """A real service (open, on loopback) that has served traffic through every level: L1, the disk level, L2 and L3,
    which with a disk level admits only vectors that proved reuse (as under `make serve`)."""
    data_dir = tmp_path_factory.mktemp("observability")
    with LiveServer(Settings(redis_url=redis_server, data_dir=data_dir, disk_path=str(data_dir / "disk"))) as live:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            embed_repeatedly(http, 3)
            live.state.caches[live.state.default_model].flush()
            live.http = http
            yield live


def embed_repeatedly(http: httpx.Client, times: int) -> None:
    texts = [f"observability text {i}" for i in range(5)]
    for _ in range(times):
        assert http.post("/embed", json={"inputs": texts}).status_code == 200


@pytest.fixture(scope="module")
def scraped(service) -> tuple[str, dict]:
    """/metrics of the service after its first traffic, and its /stats at that moment."""
    return service.http.get("/metrics").text, service.http.get("/stats").json()


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def exported_names(text: str) -> set[str]:
    """Every series name a query may use: sample names, and each family's name (a family with no samples yet,
    such as the prefix gauges before any prefix is registered, is still exported)."""
    names = set()
    for family in families(text).values():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [])
        names.update(family.name + suffix for suffix in suffixes)
    return names


def test_latency_histogram_counts_every_call_in_its_bucket():
    recorder = LevelRecorder("L1", max_events=2)  # the percentile log is bounded; the histogram is not
    for latency_s in (0.00005, 0.0001, 0.0003, 0.0003, 0.04, 30.0):
        recorder.record(hits=1, misses=0, latency_s=latency_s)
    histogram = recorder.histogram()
    cumulative = dict(zip(histogram.bounds_s, histogram.counts))
    assert histogram.bounds_s == LATENCY_BUCKETS_S
    # le semantics: 0.0001 falls in the 0.0001 bucket; 30 s is past the last bound, counted only in +Inf.
    assert cumulative[0.0001] == 2 and cumulative[0.00025] == 2 and cumulative[0.0005] == 4
    assert cumulative[0.025] == 4 and cumulative[0.05] == 5 and cumulative[10.0] == 5
    assert histogram.num_calls == 6 and histogram.sum_s == pytest.approx(30.04075)


def test_metrics_histograms_agree_with_stats(scraped):
    metrics, stats = scraped
    found = families(metrics)
    assert found["ragcache_lookup_duration_seconds"].type == "histogram"
    model = next(iter(stats["models"]))
    since_start = stats["models"][model]["since_start"]
    requests = [s for s in found["ragcache_request_duration_seconds"].samples if s.labels["model"] == model]
    count = next(s.value for s in requests if s.name.endswith("_count"))
    assert count == since_start["requests"] >= 3
    buckets = [s for s in requests if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in buckets][-1] == "+Inf" and buckets[-1].value == count
    assert all(a.value <= b.value for a, b in zip(buckets, buckets[1:]))  # cumulative
    levels = {s.labels["level"] for s in found["ragcache_lookup_duration_seconds"].samples}
    assert {"L1", "L2", "L3"} <= levels


def samples_of(found: dict, name: str) -> dict[tuple[str, ...], float]:
    """A family's values by (level,) or (level, admission): the service has one model."""
    return {(sample.labels["level"], *([sample.labels["admission"]] if "admission" in sample.labels else [])): sample.value
            for sample in found[name].samples}


# The level figures of /stats (``levels`` of a model) and the counters /metrics exports them as.
STATE_COUNTERS = {"num_evicted": "ragcache_level_evicted", "num_corrupt": "ragcache_level_corrupt",
                  "num_rotations": "ragcache_level_rotations", "num_lost": "ragcache_level_generations_lost",
                  "num_admitted": "ragcache_level_admitted", "num_declined": "ragcache_level_declined"}


def test_level_figures_and_l3_admission_in_metrics_agree_with_stats(scraped):
    metrics, stats = scraped
    found = families(metrics)
    entry = next(iter(stats["models"].values()))
    states = entry["levels"]
    for field, name in STATE_COUNTERS.items():
        assert found[name].type == "counter"
        expected = {(level,): state[field] for level, state in states.items() if field in state}
        assert samples_of(found, name) == expected, name
    # The disk level reports its store's figures in /stats too (num_lost among them), L3 its admission rule.
    assert {"num_evicted", "num_corrupt", "num_rotations", "num_lost", "used_bytes", "capacity_bytes"} <= set(states["disk"])
    assert states["L3"]["admission"] == "reuse" and "admission" not in states["L1"]
    assert samples_of(found, "ragcache_level_admission") == {("L3", "reuse"): 1.0}
    # Every computed vector was declined by L3; none came back from below L1, so none was admitted.
    assert states["L3"]["num_declined"] == entry["since_start"]["texts_computed"] == 5
    assert states["L3"]["num_admitted"] == 0


def test_disk_and_admission_counters_are_exported_exactly(tmp_path):
    """In one process, on a real disk store: a generation lost to a corrupt file, rotations and evictions under a
    write storm, a corrupt value, and L3 admitting what the disk level served after it left L1."""
    capacity = 4 << 20  # four generations of 1 MiB, the smallest allowed
    seeded = DiskStore(tmp_path, capacity_bytes=capacity, num_generations=4)
    seeded.put_many([(b"seed", b"value")])
    seeded.close()
    data = next(tmp_path.glob("gen-*/data.mdb"))
    data.write_bytes(os.urandom(data.stat().st_size))  # no longer an LMDB file: dropped and counted when opened
    store = DiskStore(tmp_path, capacity_bytes=capacity, num_generations=4)
    dim = 64
    l1 = MemoryTier(4 * dim * 4, dim, torch.float32)  # four vectors
    disk = DiskTier(store, dim=dim, dtype=torch.float32)
    l3 = MemoryTier(100 * dim * 4, dim, torch.float32)
    l3.name = "L3"
    cache = EmbeddingCache(HashEncoder(dim), Levels([l1, disk, l3], dim=dim, dtype=torch.float32, write_behind=False,
                                                  admit_on_reuse=["L3"]))
    try:
        texts = [f"admitted text {i}" for i in range(8)]
        cache.embed(texts)  # 8 computed: L3 declines all 8; L1 keeps four of them
        cache.embed(texts[:4])  # out of L1, served by the disk level: they proved reuse, so L3 admits them
        store.put_many([(b"rc:torn", b"not a vector")])
        assert disk.get_many(["rc:torn"]).index == []
        for first in range(0, 20_000, 256):  # five generations' worth: the store rotates and drops its oldest
            keys = [f"rc:storm:{i}" for i in range(first, first + 256)]
            disk.put_many(keys, torch.zeros(len(keys), dim))
        registry = CollectorRegistry()
        registry.register(CacheCollector(lambda: [cache]))
        found = families(generate_latest(registry).decode())
        figures = store.figures()
        assert figures.num_rotations >= 4 and figures.num_evicted >= 8
        assert samples_of(found, "ragcache_level_rotations") == {("disk",): figures.num_rotations}
        assert samples_of(found, "ragcache_level_generations_lost") == {("disk",): 1}
        assert samples_of(found, "ragcache_level_corrupt") == {("disk",): 1}
        assert samples_of(found, "ragcache_level_evicted") == {("L1",): 4, ("disk",): figures.num_evicted, ("L3",): 0}
        assert samples_of(found, "ragcache_level_admitted") == {("L3",): 4}
        assert samples_of(found, "ragcache_level_declined") == {("L3",): 8}
        assert samples_of(found, "ragcache_level_admission") == {("L3", "reuse"): 1.0}
        assert cache.level_states()["disk"]["num_lost"] == 1
    finally:
        cache.close()
        store.close()


def test_promtool_accepts_the_exposition(scraped):
    metrics, _ = scraped
    result = subprocess.run([promtool(), "check", "metrics"], input=metrics, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_prometheus_config(tmp_path):
    # promtool checks that the credentials file exists; in the container the entrypoint writes it.
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    assert job["authorization"]["credentials_file"] == "/prometheus/ragcache.key"
    assert job["dns_sd_configs"][0]["names"] == ["ragcache"]  # every replica, by Docker's DNS
    (tmp_path / "ragcache.key").write_text("key")
    text = (MONITORING / "prometheus.yml").read_text().replace("/prometheus/ragcache.key", str(tmp_path / "ragcache.key"))
    (tmp_path / "prometheus.yml").write_text(text)
    result = subprocess.run([promtool(), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    return queries + [variable["query"]["query"] for variable in dashboard["templating"]["list"]]


def test_every_dashboard_query_uses_metrics_the_service_exports(scraped):
    metrics, _ = scraped
    exported = exported_names(metrics) | PROMETHEUS_SERIES
    used = {name for query in dashboard_queries() for name in METRIC_NAME.findall(query)}
    assert {"ragcache_lookup_duration_seconds_bucket", "ragcache_level_up", "ragcache_prefix_residency_ratio",
            "ragcache_misses_by_cause_total", "ragcache_level_admitted_total", "ragcache_level_declined_total"} <= used
    assert used <= exported, f"not exported by the service: {sorted(used - exported)}"


def test_dashboard_is_well_formed_and_uses_the_provisioned_datasource():
    dashboard = json.loads(DASHBOARD.read_text())
    datasources = yaml.safe_load((MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    uid = datasources["datasources"][0]["uid"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "ragcache"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid and target["expr"].count("(") == target["expr"].count(")")
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for subject in ("hit rate", "latency", "computed", "levels down", "prefix residency", "by cause", "admission"):
        assert subject in titles
    provider = yaml.safe_load((MONITORING / "grafana" / "provisioning" / "dashboards" / "ragcache.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel, with Grafana's variables replaced as Grafana would."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"].replace("$__rate_interval", "30s").replace("$model", ".*"))
            for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_panel_query_is_valid_promql(tmp_path):
    # promtool parses recording rules with Prometheus' own PromQL parser: one rule per panel query.
    rules = [{"record": f"dashboard:query_{i}", "expr": query} for i, (_, query) in enumerate(panel_queries())]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool(), "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def prometheus(service, tmp_path_factory):
    """Debian's Prometheus scraping the service every second; its HTTP API URL."""
    executable = shutil.which("prometheus")
    if executable is None:
        pytest.fail("prometheus is not installed (apt-get install prometheus; make test does: mk/system.mk)")
    folder = tmp_path_factory.mktemp("prometheus")
    target = service.url.removeprefix("http://")
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [{"job_name": "ragcache", "static_configs": [{"targets": [target]}]}]}
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    log = (folder / "prometheus.log").open("w")
    process = subprocess.Popen([executable, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
                                f"--web.listen-address={url.removeprefix('http://')}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(process, url + "/-/ready", name="prometheus", timeout_s=60, interval_s=0.2,
                     log_tail=lambda: (folder / "prometheus.log").read_text()[-2000:])
        yield url
    finally:
        stop_process(process)
        log.close()


def query(prometheus: str, promql: str) -> list:
    answer = httpx.get(prometheus + "/api/v1/query", params={"query": promql}, timeout=30).json()
    assert answer["status"] == "success", (promql, answer)
    return answer["data"]["result"]


def test_a_real_prometheus_answers_every_panel_from_the_service(service, prometheus):
    # Traffic while Prometheus scrapes, so that every rate() has two samples that differ.
    deadline = time.monotonic() + 60
    while not query(prometheus, 'up{job="ragcache"} == 1'):
        assert time.monotonic() < deadline, "Prometheus never scraped the service"
        time.sleep(0.5)
    for _ in range(4):
        embed_repeatedly(service.http, 2)
        time.sleep(1.2)
    time.sleep(2)
    answers = {(title, promql): query(prometheus, promql) for title, promql in panel_queries()}
    # The prefix panels are empty without a vLLM target to warm, the upstream one without a remote model;
    # every cache panel has data.
    empty = [title for (title, _), result in answers.items() if not result and "refix" not in title and "Upstream" not in title]
    assert not empty, f"panels without data: {empty}"
    hit_rate = {series["metric"].get("level"): float(series["value"][1])
                for series in answers[next(key for key in answers if "ragcache_hits_total" in key[1] and "/" in key[1])]}
    assert 0 < hit_rate["L1"] <= 1
