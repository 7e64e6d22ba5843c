"""Prometheus exposition of the cache's own stats, read at scrape time (no second set of counters)."""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ragcache.cache import EmbeddingCache

__all__ = ["CacheCollector"]


class CacheCollector(Collector):
    """Collects every cache that ``caches()`` returns; labels: model, space (id) and level."""

    def __init__(self, caches: Callable[[], Iterable[EmbeddingCache]]):
        self._caches = caches

    def collect(self):
        labels = ["model", "space", "level"]
        families = {
            name: CounterMetricFamily(f"ragcache_{name}", help_text, labels=labels)
            for name, help_text in [
                ("lookups", "Keys looked up at a cache level"),
                ("hits", "Keys found at a cache level"),
                ("misses", "Keys not found at a cache level"),
                ("errors", "Keys looked up while the level failed (served as misses)"),
            ]
        }
        latency = GaugeMetricFamily(
            "ragcache_lookup_latency_seconds", "Recent batch lookup latency of a level", labels=[*labels, "quantile"]
        )
        level_up = GaugeMetricFamily("ragcache_level_up", "1 when the level answers, 0 while it is down", labels=labels)
        texts = CounterMetricFamily("ragcache_texts", "Texts asked for", labels=labels[:2])
        computed = CounterMetricFamily("ragcache_texts_computed", "Texts the model computed", labels=labels[:2])
        compute_s = CounterMetricFamily("ragcache_compute_seconds", "Seconds spent in the model", labels=labels[:2])
        saved_s = CounterMetricFamily("ragcache_compute_seconds_saved", "Estimated model seconds saved by hits", labels=labels[:2])
        hit_ratio = GaugeMetricFamily("ragcache_hit_ratio", "Texts served by any level / texts asked for", labels=labels[:2])
        for cache in self._caches():
            stats, states = cache.stats(), cache.level_states()
            space = [stats.model, stats.space_id]
            texts.add_metric(space, stats.texts)
            computed.add_metric(space, stats.texts_computed)
            compute_s.add_metric(space, stats.compute_s)
            saved_s.add_metric(space, stats.compute_s_saved)
            hit_ratio.add_metric(space, stats.hit_rate)
            for level in stats.levels:
                label_values = [*space, level.level]
                for name, family in families.items():
                    family.add_metric(label_values, getattr(level, name))
                latency.add_metric([*label_values, "0.5"], level.latency_p50_ms / 1000)
                latency.add_metric([*label_values, "0.99"], level.latency_p99_ms / 1000)
                level_up.add_metric(label_values, 1.0 if states[level.level]["up"] else 0.0)
        yield from families.values()
        yield from (latency, level_up, texts, computed, compute_s, saved_s, hit_ratio)
