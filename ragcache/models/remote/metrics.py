"""Prometheus exposition of the remote models' upstream figures, read at scrape time from their encoders.

Labels: ``model`` (the name clients call it by) and ``provider``; errors also by ``kind`` (timeout,
unavailable, bad_response, breaker_open). Money saved is exported only for models with a configured price.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from ragcache.core.cache import EmbeddingCache
from ragcache.models.remote.stats import UpstreamStats, savings

__all__ = ["UpstreamCollector"]


class UpstreamCollector(Collector):
    """Collects every remote model among the ``(name, cache)`` pairs that ``caches()`` returns."""

    def __init__(self, caches: Callable[[], Iterable[tuple[str, EmbeddingCache]]]):
        self._caches = caches

    def collect(self):
        labels = ["model", "provider"]

        def counter(name: str, help_text: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(f"ragcache_upstream_{name}", help_text, labels=[*labels, *extra])

        requests = counter("requests", "Requests sent to the upstream, retries included")
        texts = counter("texts", "Texts sent to the upstream (misses of every level)")
        tokens = counter("tokens", "Tokens sent to the upstream (its own usage count, else counted or estimated)")
        retries = counter("retries", "Upstream requests tried again (429, 5xx, refused or dropped connections)")
        errors = counter("errors", "Upstream calls that failed for good, by kind", ("kind",))
        tokens_saved = counter("tokens_saved", "Tokens cache hits did not send (hits x mean tokens per text sent)")
        money_saved = counter("money_saved", "Money cache hits did not spend (tokens saved x the configured price)")
        latency = SummaryMetricFamily("ragcache_upstream_latency_seconds", "Recent latency of one upstream request", labels=labels)
        up = GaugeMetricFamily("ragcache_upstream_up", "1 while the upstream's breaker is closed, 0 while it is skipped", labels=labels)
        for name, cache in self._caches():
            stats = cache.encoder.stats()
            if not isinstance(stats, UpstreamStats):
                continue
            values = [name, stats.provider]
            saved = savings(stats, cache.stats().hits)
            requests.add_metric(values, stats.num_calls)
            texts.add_metric(values, stats.num_texts)
            tokens.add_metric(values, stats.num_tokens)
            retries.add_metric(values, stats.num_retries)
            for kind, count in sorted(stats.errors.items()):
                errors.add_metric([*values, kind], count)
            tokens_saved.add_metric(values, saved.tokens_saved)
            if saved.money_saved is not None:
                money_saved.add_metric(values, saved.money_saved)
            latency.add_metric(values, count_value=stats.num_calls, sum_value=stats.compute_s)
            quantiles = (("0.5", stats.latency_p50_ms), ("0.95", stats.latency_p95_ms), ("0.99", stats.latency_p99_ms))
            for quantile, value_ms in quantiles:
                sample_labels = {**dict(zip(labels, values)), "quantile": quantile}
                latency.add_sample("ragcache_upstream_latency_seconds", sample_labels, value_ms / 1000)
            up.add_metric(values, 1.0 if stats.up else 0.0)
        yield from (requests, texts, tokens, retries, errors, tokens_saved, money_saved, latency, up)
