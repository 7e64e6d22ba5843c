"""OpenTelemetry tracing (ragcache.observe.tracing): off by default; on, a span per embed call with a child per level
looked up and one for the model, under the service's span per HTTP request. The service's spans are read
from a real OTLP/HTTP export, received by a small loopback collector of the test's own."""

from __future__ import annotations

import http.server
import threading

import httpx
import pytest
import torch
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.observe.tracing import Tracing
from ragcache.settings import Settings
from ragcache.storage.processes import free_port
from ragcache.tiers import MemoryTier
from tests.fakes import HashEncoder
from tests.live_server import LiveServer


def test_tracing_is_off_by_default():
    assert Settings().service.tracing == "off"
    assert not Tracing.configured(Settings().service.tracing).enabled


def test_an_embed_call_is_a_span_with_a_child_per_level_and_one_for_the_model():
    exporter = InMemorySpanExporter()
    tracing = Tracing.exporting_to(exporter)
    encoder = HashEncoder(dim=8)
    tiers = [MemoryTier(64 * 8 * 4, 8, torch.float32), MemoryTier(64 * 8 * 4, 8, torch.float32)]
    tiers[1].name = "L2"
    with EmbeddingCache(encoder, Levels(tiers, dim=8, dtype=torch.float32, write_behind=False, tracer=tracing.tracer)) as cache:
        cache.embed(["a", "b", "a"])
        cache.embed(["a", "b"])
    tracing.shutdown()
    spans = exporter.get_finished_spans()
    assert [span.name for span in spans] == ["ragcache.lookup", "ragcache.lookup", "ragcache.compute", "ragcache.embed",
                                             "ragcache.lookup", "ragcache.embed"]
    first, second = spans[3], spans[5]
    assert all(span.parent.span_id == first.context.span_id for span in spans[:3])
    assert spans[4].parent.span_id == second.context.span_id
    assert dict(spans[0].attributes) == {"ragcache.level": "L1", "ragcache.num_keys": 2, "ragcache.num_hits": 0,
                                         "ragcache.level_down": False}
    assert spans[2].attributes["ragcache.num_texts"] == 2  # "a" repeats: computed once
    assert first.attributes["ragcache.num_texts"] == 3 and first.attributes["ragcache.served.compute"] == 3
    assert second.attributes["ragcache.served.L1"] == 2 and spans[4].attributes["ragcache.num_hits"] == 2


class Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP traces endpoint that keeps what it receives (protobuf bodies)."""

    received: list[bytes] = []

    def do_POST(self):  # noqa: N802 - the name http.server calls
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            type(self).received.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def collector():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Collector)
    Collector.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()
    server.server_close()


def received_spans() -> list:
    spans = []
    for body in Collector.received:
        request = ExportTraceServiceRequest.FromString(body)
        spans += [span for resource in request.resource_spans for scope in resource.scope_spans for span in scope.spans]
    return spans


def attributes(span) -> dict:
    return {kv.key: kv.value.int_value or kv.value.string_value or kv.value.bool_value for kv in span.attributes}


def test_the_service_exports_a_request_span_with_the_cache_spans_under_it(redis_server, tmp_path, collector):
    settings = Settings(redis_url=redis_server, milvus_uri="off", data_dir=tmp_path, tracing="otlp", tracing_endpoint=collector)
    with LiveServer(settings) as live:
        texts = ["a traced text", "another traced text"]
        assert httpx.post(live.url + "/embed", json={"inputs": texts}, timeout=60).status_code == 200
        assert httpx.post(live.url + "/embed", json={"inputs": texts}, timeout=60).status_code == 200
    # Stopping the service shut its tracer down, which exported every span still queued.
    spans = received_spans()
    requests = [span for span in spans if span.name == "POST /embed"]
    assert len(requests) == 2
    computed, resident = (next(s for s in spans if s.name == "ragcache.embed" and s.parent_span_id == request.span_id)
                          for request in requests)
    children = [span for span in spans if span.parent_span_id == computed.span_id]
    assert {(span.name, attributes(span).get("ragcache.level")) for span in children} == {
        ("ragcache.lookup", "L1"), ("ragcache.lookup", "L2"), ("ragcache.compute", None)}
    assert attributes(computed)["ragcache.served.compute"] == 2
    # The repeat is answered from L1 on the event loop: its span says so, and nothing was computed.
    assert attributes(resident)["ragcache.resident"] is True and attributes(resident)["ragcache.served.L1"] == 2
    assert all(span.trace_id == request.trace_id for request in requests[:1] for span in [computed, *children])
    assert attributes(requests[0])["http.response.status_code"] == 200
