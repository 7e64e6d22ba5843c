"""What the embedding cache counts of its requests (``ragcache.core.cache``): every request's hits, misses and
latency, overall and per scope (a tenant's keys, a named prompt), and why each missed key missed
(``ragcache.core.causes``). The walk only reports; what it reports is kept and summed here."""

from __future__ import annotations

from ragcache.core.causes import MissLedger
from ragcache.core.encoder import Encoder
from ragcache.core.keys import EmbeddingSpace
from ragcache.core.levels import Found, Levels
from ragcache.core.scope import UNSCOPED, Scope, ScopeRecorders, ScopeStats
from ragcache.core.stats import CacheStats, LatencyHistogram, LevelRecorder

__all__ = ["RequestAccounts"]


class RequestAccounts:
    """The counters of one cache's requests, shared by its views (thread-safe as its recorders are)."""

    def __init__(self, encoder: Encoder, levels: Levels, *, miss_ledger_entries: int) -> None:
        self._encoder = encoder
        self._levels = levels
        self._requests = LevelRecorder("cache", window_s=levels.window_s)
        # Per scope: only those that are not the model's own (UNSCOPED), which ``_requests`` alone counts.
        self._scopes = ScopeRecorders(window_s=levels.window_s)
        self._ledger = MissLedger(miss_ledger_entries)

    def record(self, scope: Scope, *, hits: int, misses: int, latency_s: float) -> None:
        """One request answered: ``misses`` of its texts computed here, the rest served by a level."""
        self._requests.record(hits=hits, misses=misses, latency_s=latency_s)
        if scope != UNSCOPED:
            self._scopes.record(scope, hits=hits, misses=misses, latency_s=latency_s)

    def explain_misses(self, scope: Scope, space: EmbeddingSpace, texts: list[str], found: Found) -> None:
        """The cause of each key some level missed in a walk (``texts``: its distinct prepared texts), judged on what
        the walk saw, counted per level."""
        if not (found.served > 0).any():
            return  # every key in L1: no miss to explain
        levels = self._levels
        scope_hash = hash(scope)  # once: a Scope's own hash walks its fields
        counts = self._ledger.explain(
            [(scope_hash, text) for text in texts], space.generation, found.served, num_levels=len(levels),
            unavailable=found.unavailable, bypassed=found.bypassed, on_reuse=levels.on_reuse, ttl_s=levels.ttl_s)
        levels.record_causes(counts)

    def stats(self, space: EmbeddingSpace, *, recent: bool) -> CacheStats:
        """Hit rates and latencies of ``space``'s cache since start, or over the recent window."""
        overall = self._requests.snapshot(recent=recent)
        encoder_stats = self._encoder.stats()
        return CacheStats(
            space_id=space.space_id,
            model=space.model,
            period="recent" if recent else "since_start",
            period_s=self._requests.window_s if recent else 0.0,
            requests=self._requests.num_calls(recent=recent),
            texts=overall.lookups,
            hits=overall.hits,
            hit_rate=overall.hit_rate,
            texts_computed=overall.misses,
            compute_s=encoder_stats.compute_s,
            compute_s_saved=overall.hits * encoder_stats.seconds_per_text,
            levels=self._levels.snapshots(recent=recent),
        )

    def tenants(self, *, recent: bool) -> dict[str, ScopeStats]:
        return self._scopes.tenants(recent=recent)

    def prompts(self, *, recent: bool) -> dict[str, ScopeStats]:
        return self._scopes.prompts(recent=recent)

    def histograms(self) -> dict[str, LatencyHistogram]:
        """Per level, and for whole requests (``"request"``), every batch lookup's latency since start."""
        return {**self._levels.histograms(), "request": self._requests.histogram()}
