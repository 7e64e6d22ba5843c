"""What a remote model costs and what the cache saves on it: calls, texts and tokens sent, retries,
errors by kind, upstream latency, and the tokens and money that cache hits did not spend."""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

import numpy as np

from ragcache.core.encoder import EncoderStats

__all__ = ["UpstreamStats", "UpstreamRecorder", "UpstreamSavings", "savings", "upstream_figures"]


@dataclass(frozen=True)
class UpstreamStats(EncoderStats):
    """``EncoderStats`` (the cache reads those) plus the upstream's own figures. ``num_texts`` counts texts
    sent; ``num_batches`` upstream calls that answered; ``compute_s`` seconds spent in them."""

    provider: str = ""
    endpoint: str = ""  # scheme://host:port/path, never credentials
    num_calls: int = 0  # upstream requests sent, retries included
    num_tokens: int = 0  # tokens sent (the upstream's own usage count when it reports one)
    num_retries: int = 0
    num_errors: int = 0  # upstream calls that failed for good (after their retries)
    errors: dict[str, int] = field(default_factory=dict)  # by kind: timeout, unavailable, bad_response, ...
    latency_p50_ms: float = 0.0  # one upstream request, recent
    latency_p95_ms: float = 0.0
    latency_p99_ms: float = 0.0
    token_counting: str = "estimate"  # "tokenizer" or "estimate" (tokens.py)
    price_per_million_tokens: float | None = None
    up: bool = True  # the breaker: False while the upstream is skipped after failures

    @property
    def tokens_per_text(self) -> float:
        return self.num_tokens / self.num_texts if self.num_texts else 0.0


@dataclass(frozen=True)
class UpstreamSavings:
    """What cache hits did not send upstream: texts, and an estimate of tokens and money."""

    texts_saved: int
    tokens_saved: int  # hits x the mean tokens of the texts that were sent
    money_saved: float | None  # tokens_saved x price; None without a configured price


def savings(stats: UpstreamStats, hits: int) -> UpstreamSavings:
    """Savings of ``hits`` cache hits, priced with the mean tokens per text actually sent."""
    tokens = round(hits * stats.tokens_per_text)
    price = stats.price_per_million_tokens
    return UpstreamSavings(hits, tokens, None if price is None else round(tokens * price / 1e6, 6))


class UpstreamRecorder:
    """Thread-safe counters for one upstream; latencies of the latest ``max_events`` requests only."""

    def __init__(self, max_events: int = 4096):
        self._lock = threading.Lock()
        self._latencies_s: deque[float] = deque(maxlen=max_events)
        self._batch_sizes: deque[int] = deque(maxlen=256)
        self._errors: Counter[str] = Counter()
        self.num_calls = self.num_answered = self.num_texts = self.num_tokens = self.num_retries = 0
        self.seconds = 0.0

    def attempt(self, latency_s: float) -> None:
        """One request sent and answered or failed (retries included)."""
        with self._lock:
            self.num_calls += 1
            self.seconds += latency_s
            self._latencies_s.append(latency_s)

    def answered(self, num_texts: int, num_tokens: int) -> None:
        with self._lock:
            self.num_answered += 1
            self.num_texts += num_texts
            self.num_tokens += num_tokens
            self._batch_sizes.append(num_texts)

    def retried(self) -> None:
        with self._lock:
            self.num_retries += 1

    def failed(self, kind: str) -> None:
        with self._lock:
            self._errors[kind] += 1

    def snapshot(self, **fixed) -> UpstreamStats:
        with self._lock:
            latencies = np.array(self._latencies_s) if self._latencies_s else np.zeros(1)
            p50, p95, p99 = (float(x) for x in np.percentile(latencies, [50, 95, 99]) * 1000)
            return UpstreamStats(
                num_texts=self.num_texts,
                num_batches=self.num_answered,
                compute_s=self.seconds,
                batch_sizes=tuple(self._batch_sizes),
                num_calls=self.num_calls,
                num_tokens=self.num_tokens,
                num_retries=self.num_retries,
                num_errors=sum(self._errors.values()),
                errors=dict(self._errors),
                latency_p50_ms=p50,
                latency_p95_ms=p95,
                latency_p99_ms=p99,
                **fixed,
            )


def upstream_figures(encoder_stats: object, hits: int) -> dict | None:
    """The ``upstream`` entry of a model in /stats: the upstream's figures and what hits saved; None for a
    model that is not remote."""
    if not isinstance(encoder_stats, UpstreamStats):
        return None
    figures = asdict(encoder_stats)
    figures.pop("batch_sizes")  # the cache's own figures have them; here they would only repeat
    return {**figures, **asdict(savings(encoder_stats, hits))}
