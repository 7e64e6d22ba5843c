"""Prometheus view of the registry: a custom collector that reads a stats snapshot at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from .registry import PrefixRegistry

__all__ = ["PrefixMetricsCollector", "register_prefix_metrics"]


class PrefixMetricsCollector(Collector):
    """Exposes per-prefix warm counters and per-target vLLM prefix-cache counters.

    Collecting never calls vLLM: target counters are the ones the keep-warm loop last scraped.
    """

    def __init__(self, registry: PrefixRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        stats = self._registry.stats()
        tokens = GaugeMetricFamily("ragcache_prefix_tokens", "Tokens in the prefix", labels=["prefix"])
        warms = CounterMetricFamily("ragcache_prefix_warms", "Warm requests by outcome",
                                    labels=["prefix", "outcome"])
        residency = GaugeMetricFamily("ragcache_prefix_residency_ratio",
                                      "Re-warms that found the prefix resident / judged re-warms", labels=["prefix"])
        interval = GaugeMetricFamily("ragcache_prefix_rewarm_interval_seconds", "Current re-warm interval",
                                     labels=["prefix"])
        uses = CounterMetricFamily("ragcache_prefix_uses", "Requests that used the prefix", labels=["prefix"])
        resident = GaugeMetricFamily("ragcache_prefix_endpoint_resident",
                                     "1 when the last judged warm on this vLLM endpoint found the prefix resident",
                                     labels=["prefix", "endpoint"])
        evictions = CounterMetricFamily("ragcache_prefix_endpoint_evictions",
                                        "Warms on this vLLM endpoint that found the prefix evicted",
                                        labels=["prefix", "endpoint"])
        blocks = GaugeMetricFamily("ragcache_prefix_endpoint_resident_blocks",
                                   "The prefix's KV blocks the endpoint holds, by its KV events (synced endpoints only)",
                                   labels=["prefix", "endpoint"])
        full = GaugeMetricFamily("ragcache_prefix_endpoint_blocks", "The prefix's full KV blocks", labels=["prefix", "endpoint"])
        keepable = GaugeMetricFamily("ragcache_prefix_endpoint_keepable",
                                     "0 while churn evicts the prefix faster than it can be re-warmed (no warms sent)",
                                     labels=["prefix", "endpoint"])
        for p in stats.prefixes:
            for endpoint in p.endpoints:
                if endpoint.resident_blocks is not None and endpoint.num_blocks is not None:
                    blocks.add_metric([p.name, endpoint.base_url], endpoint.resident_blocks)
                    full.add_metric([p.name, endpoint.base_url], endpoint.num_blocks)
                keepable.add_metric([p.name, endpoint.base_url], 1.0 if endpoint.keepable else 0.0)
            if p.num_tokens is not None:
                tokens.add_metric([p.name], p.num_tokens)
            for outcome, value in (("resident", p.num_resident), ("evicted", p.num_evicted),
                                   ("error", p.num_errors), ("skipped", p.num_skipped),
                                   ("prime", p.num_warms - p.num_resident - p.num_evicted - p.num_errors)):
                warms.add_metric([p.name, outcome], value)
            if p.residency_rate is not None:
                residency.add_metric([p.name], p.residency_rate)
            interval.add_metric([p.name], p.rewarm_interval_s)
            uses.add_metric([p.name], p.num_uses)
            for endpoint in p.endpoints:
                if endpoint.resident is not None:
                    resident.add_metric([p.name, endpoint.base_url], 1.0 if endpoint.resident else 0.0)
                evictions.add_metric([p.name, endpoint.base_url], endpoint.num_evicted)
        up = GaugeMetricFamily("ragcache_vllm_target_up", "1 when the vLLM target answered last time",
                               labels=["target"])
        queries = GaugeMetricFamily("ragcache_vllm_prefix_cache_queries",
                                    "vllm:prefix_cache_queries_total as last scraped (tokens)", labels=["target"])
        hits = GaugeMetricFamily("ragcache_vllm_prefix_cache_hits",
                                 "vllm:prefix_cache_hits_total as last scraped (tokens)", labels=["target"])
        hit_rate = GaugeMetricFamily("ragcache_vllm_prefix_cache_hit_ratio", "hits / queries of vLLM's prefix cache",
                                     labels=["target"])
        for t in stats.targets:
            up.add_metric([t.base_url], 1.0 if t.up else 0.0)
            if t.prefix_cache_queries is not None and t.prefix_cache_hits is not None:
                queries.add_metric([t.base_url], t.prefix_cache_queries)
                hits.add_metric([t.base_url], t.prefix_cache_hits)
            if t.prefix_cache_hit_rate is not None:
                hit_rate.add_metric([t.base_url], t.prefix_cache_hit_rate)
        sent = CounterMetricFamily("ragcache_prefix_warm_requests", "Warm requests sent to vLLM")
        sent.add_metric([], stats.num_warms_sent)
        deferred = CounterMetricFamily("ragcache_prefix_warms_deferred", "Warms deferred by the per-minute budget")
        deferred.add_metric([], stats.num_warms_deferred)
        held = CounterMetricFamily("ragcache_prefix_warms_held_busy",
                                   "Due warms held back while their vLLM endpoint reported users waiting or running")
        held.add_metric([], stats.num_warms_held_busy)
        avoided = CounterMetricFamily("ragcache_prefix_warms_avoided",
                                      "Due timer warms not sent: the engine's KV events showed the prefix whole")
        avoided.add_metric([], stats.num_warms_avoided)
        trusted = GaugeMetricFamily("ragcache_prefix_kv_events_trusted",
                                    "0 while the endpoint's KV events are ignored: they claimed blocks warms did not find",
                                    labels=["endpoint"])
        synced = GaugeMetricFamily("ragcache_prefix_kv_events_synced",
                                   "1 while the endpoint's KV events are synced and believed (its residency is exact)",
                                   labels=["endpoint"])
        checks = CounterMetricFamily("ragcache_prefix_kv_events_checks",
                                     "Warms that checked what the endpoint's KV events claimed", labels=["endpoint"])
        disagreements = CounterMetricFamily("ragcache_prefix_kv_events_disagreements",
                                            "Warms that did not find blocks the endpoint's KV events claimed",
                                            labels=["endpoint"])
        new_streams = CounterMetricFamily("ragcache_prefix_kv_events_new_streams",
                                          "Publishers back with another stream (an engine restarted): index cleared",
                                          labels=["endpoint"])
        for e in stats.events:
            trusted.add_metric([e.base_url], 1.0 if e.trusted else 0.0)
            synced.add_metric([e.base_url], 1.0 if e.state == "synced" else 0.0)
            checks.add_metric([e.base_url], e.num_checks)
            disagreements.add_metric([e.base_url], e.num_disagreements)
            new_streams.add_metric([e.base_url], e.num_new_streams)
        yield from (tokens, warms, residency, interval, uses, resident, evictions, up, queries, hits, hit_rate, sent,
                    deferred, held, blocks, full, keepable, avoided, trusted, synced, checks, disagreements, new_streams)


def register_prefix_metrics(registry: PrefixRegistry, collector_registry: CollectorRegistry) -> PrefixMetricsCollector:
    """Register the registry's collector in ``collector_registry`` and return it (for unregistering)."""
    collector = PrefixMetricsCollector(registry)
    collector_registry.register(collector)
    return collector
