"""OpenTelemetry tracing of a request through the levels, off by default (``RAGCACHE_TRACING``).

With ``tracing=otlp`` (spans sent over OTLP/HTTP to ``tracing_endpoint``, or wherever the standard
``OTEL_EXPORTER_OTLP_*`` variables say) or ``tracing=console`` (printed), each embed call is a span
``ragcache.embed`` with a child per level looked up (``ragcache.lookup``: level, keys, hits, whether the
level failed) and one for the texts sent to the model (``ragcache.compute``). The service adds a span per
HTTP request around them. Off, the cache holds no tracer and does no tracing work at all.

The SDK is an optional dependency (``pip install 'ragcache[tracing]'``); the provider is this process's own
(not installed as OpenTelemetry's global one), so several caches or services in one process do not mix.
Spans are exported by a background thread in batches; at most ``MAX_QUEUED_SPANS`` wait, beyond that new
spans are dropped (a slow collector never holds requests up), and each export has a deadline.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ragcache.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer


__all__ = ["Tracing", "MAX_QUEUED_SPANS", "EXPORT_TIMEOUT_S"]

MAX_QUEUED_SPANS = 2048
EXPORT_TIMEOUT_S = 5.0


class Tracing:
    """A tracer and the provider that exports its spans, or nothing (tracing off)."""

    def __init__(self, tracer: Tracer | None = None, provider: TracerProvider | None = None):
        self.tracer = tracer
        self._provider = provider

    @classmethod
    def configured(cls, mode: str, endpoint: str | None = None) -> Tracing:
        """As the settings ``tracing`` / ``tracing_endpoint`` say: ``off``, ``console`` or ``otlp``."""
        if mode == "off":
            return cls()
        return cls.exporting_to(_exporter(mode, endpoint))

    @classmethod
    def exporting_to(cls, exporter: SpanExporter) -> Tracing:
        """Spans exported by ``exporter`` in batches (tests pass an in-memory one)."""
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ConfigError("RAGCACHE_TRACING needs the OpenTelemetry SDK: pip install 'ragcache[tracing]'") from exc
        provider = TracerProvider(resource=Resource.create({"service.name": "ragcache"}))
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=MAX_QUEUED_SPANS,
                                                       export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000)))
        return cls(provider.get_tracer("ragcache"), provider)

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def shutdown(self) -> None:
        """Export what is queued (within the export deadline) and stop."""
        if self._provider is not None:
            self._provider.shutdown()


@contextlib.contextmanager
def span(tracer: Tracer | None, name: str, attributes: Mapping[str, Any]) -> Iterator[Span | None]:
    """A span under the current one, or nothing when ``tracer`` is None (tracing off)."""
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, attributes=dict(attributes)) as current:
        yield current


def _exporter(kind: str, endpoint: str | None) -> SpanExporter:
    try:
        if kind == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            # The stream of now: ConsoleSpanExporter's default is sys.stdout as it was when OpenTelemetry was first
            # imported, which a process that redirects its output later (a test's capture) no longer writes to.
            return ConsoleSpanExporter(out=sys.stdout)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(f"RAGCACHE_TRACING={kind} needs the OpenTelemetry SDK and exporter: pip install 'ragcache[tracing]'") from exc
    return OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
