"""Prometheus exposition of the cache's own stats, read at scrape time (no second set of counters)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from ragcache.core.cache import EmbeddingCache
from ragcache.core.stats import LatencyHistogram
from ragcache.models.drift import DriftState

__all__ = ["CacheCollector", "DriftCollector", "ServerRestartsCollector"]

# Counters a level keeps of itself (``EmbeddingCache.level_states``), exported where the level reports them:
# the state's field, the metric's name and its help. The disk level's evicted, rotations and lost are its host
# store's counts in this process, the same under every model's labels (sum them over one model, not over all).
_STATE_COUNTERS = (
    ("num_evicted", "ragcache_level_evicted", "Entries a level dropped to stay within its budget"),
    ("num_corrupt", "ragcache_level_corrupt", "Values a level found torn or corrupt, dropped and served as misses"),
    ("num_rotations", "ragcache_level_rotations", "Generations the disk level started because the newest was full"),
    ("num_lost", "ragcache_level_generations_lost", "Disk generations dropped because their file could not be read"),
    ("num_admitted", "ragcache_level_admitted", "Vectors written to a reuse-admission level (L3) because they proved "
     "reuse (served by a level below L1)"),
    ("num_declined", "ragcache_level_declined", "Computed vectors a reuse-admission level (L3) did not take"),
)


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
        # A summary: quantiles over the recent log of calls, count and sum since start (as client libraries'
        # summaries are). Its quantiles cannot be averaged across replicas; the histogram below can.
        latency = SummaryMetricFamily(
            "ragcache_lookup_latency_seconds", "Recent batch lookup latency of a level", labels=labels
        )
        # Histograms, unlike the quantiles above, add up across replicas:
        # histogram_quantile(0.99, sum by (le, level) (rate(ragcache_lookup_duration_seconds_bucket[5m]))).
        lookup_duration = HistogramMetricFamily(
            "ragcache_lookup_duration_seconds", "Batch lookup latency of a level, since start", labels=labels
        )
        request_duration = HistogramMetricFamily(
            "ragcache_request_duration_seconds", "Latency of a whole embed call through every level", labels=labels[:2]
        )
        # Why each miss happened (ragcache.core.causes): sum over cause = the level's explained misses.
        miss_causes = CounterMetricFamily("ragcache_misses_by_cause", "Keys a level missed, by cause (never_seen, evicted, "
                                          "expired, drift, bypassed, unavailable)", labels=[*labels, "cause"])
        level_up = GaugeMetricFamily("ragcache_level_up", "1 when the level answers, 0 while it is down", labels=labels)
        state_counters = {field: CounterMetricFamily(name, help_text, labels=labels) for field, name, help_text in _STATE_COUNTERS}
        # The rule a level admits vectors by, as a label of a constant 1 (a level that takes every vector has none).
        admission = GaugeMetricFamily("ragcache_level_admission", "1, labelled with the level's admission rule "
                                      "(reuse: only vectors that proved reuse)", labels=[*labels, "admission"])
        texts = CounterMetricFamily("ragcache_texts", "Texts asked for", labels=labels[:2])
        computed = CounterMetricFamily("ragcache_texts_computed", "Texts the model computed", labels=labels[:2])
        compute_s = CounterMetricFamily("ragcache_compute_seconds", "Seconds spent in the model", labels=labels[:2])
        saved_s = CounterMetricFamily("ragcache_compute_seconds_saved", "Estimated model seconds saved by hits", labels=labels[:2])
        hit_ratio = GaugeMetricFamily("ragcache_hit_ratio", "Texts served by any level / texts asked for", labels=labels[:2])
        for cache in self._caches():
            stats, states, histograms = cache.stats(), cache.level_states(), cache.latency_histograms()
            space = [stats.model, stats.space_id]
            request_duration.add_metric(space, *_buckets(histograms["request"]))
            texts.add_metric(space, stats.texts)
            computed.add_metric(space, stats.texts_computed)
            compute_s.add_metric(space, stats.compute_s)
            saved_s.add_metric(space, stats.compute_s_saved)
            hit_ratio.add_metric(space, stats.hit_rate)
            for level in stats.levels:
                label_values = [*space, level.level]
                for name, family in families.items():
                    family.add_metric(label_values, getattr(level, name))
                histogram = histograms[level.level]
                latency.add_metric(label_values, count_value=histogram.num_calls, sum_value=histogram.sum_s)
                for quantile, value_ms in (("0.5", level.latency_p50_ms), ("0.99", level.latency_p99_ms)):
                    quantile_labels = {**dict(zip(labels, label_values)), "quantile": quantile}
                    latency.add_sample("ragcache_lookup_latency_seconds", quantile_labels, value_ms / 1000)
                lookup_duration.add_metric(label_values, *_buckets(histogram))
                state = states[level.level]
                level_up.add_metric(label_values, 1.0 if state["up"] else 0.0)
                for cause, count in level.misses_by_cause.items():
                    miss_causes.add_metric([*label_values, cause], count)
                for field, family in state_counters.items():
                    if field in state:
                        family.add_metric(label_values, state[field])
                if "admission" in state:
                    admission.add_metric([*label_values, state["admission"]], 1.0)
        yield from families.values()
        yield from (latency, lookup_duration, request_duration, level_up, miss_causes, *state_counters.values(), admission,
                    texts, computed, compute_s, saved_s, hit_ratio)


def _buckets(histogram: LatencyHistogram) -> tuple[list[tuple[str, int]], float]:
    """Prometheus' (le, cumulative count) pairs ending with +Inf, and the sum."""
    buckets = [(repr(bound), count) for bound, count in zip(histogram.bounds_s, histogram.counts)]
    return [*buckets, ("+Inf", histogram.num_calls)], histogram.sum_s


class ServerRestartsCollector(Collector):
    """Restarts of the embedded servers after they died (``ragcache.storage.supervision``), by server."""

    def __init__(self, restarts: Callable[[], dict[str, int]]):
        self._restarts = restarts

    def collect(self):
        family = CounterMetricFamily("ragcache_embedded_server_restarts",
                                     "Times an embedded server (redis, milvus) died and was started again", labels=["server"])
        for server, count in sorted(self._restarts().items()):
            family.add_metric([server], count)
        yield family


class DriftCollector(Collector):
    """The drift check of every model (``ragcache.models.drift``): events, checks, the generation in use."""

    def __init__(self, states: Callable[[], Iterable[DriftState]]):
        self._states = states

    def collect(self):
        labels = ["model"]
        events = CounterMetricFamily("ragcache_drift_events", "Times the model behind a name was found changed", labels=labels)
        checks = CounterMetricFamily("ragcache_drift_checks", "Drift checks run (canaries embedded and compared)", labels=labels)
        errors = CounterMetricFamily("ragcache_drift_check_errors", "Drift checks that failed (model or stores)", labels=labels)
        generation = GaugeMetricFamily("ragcache_space_generation", "The space generation the model embeds under", labels=labels)
        distance = GaugeMetricFamily(
            "ragcache_drift_canary_distance", "Largest relative canary distance at the last check", labels=labels
        )
        tolerance = GaugeMetricFamily("ragcache_drift_tolerance", "Canary distance beyond which the model changed", labels=labels)
        for state in self._states():
            model = [state.model]
            events.add_metric(model, state.num_drift_events)
            checks.add_metric(model, state.num_checks)
            errors.add_metric(model, state.num_check_errors)
            generation.add_metric(model, state.generation)
            tolerance.add_metric(model, state.tolerance)
            if state.last_distance is not None:
                distance.add_metric(model, state.last_distance)
        yield from (events, checks, errors, generation, distance, tolerance)
