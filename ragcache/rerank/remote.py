"""A remote rerank API over HTTP: text-embeddings-inference's ``/rerank`` (``tei``) or the Cohere shape that
Infinity and Cohere serve (``cohere``).

    tei:    {"query", "texts", "truncate", "raw_scores": false} -> [{"index", "score"}]
    cohere: {"query", "documents", "model", "return_documents": false} -> {"results": [{"index", "relevance_score"}]}

Every call goes through the one outbound helper (``ragcache.outbound.Upstream``): an overall deadline
(``timeout_s``, the whole call: an upstream trickling its answer is cut off at it), a cap on the answer's
bytes, no redirects, retries of refused or dropped connections, 429 and 5xx (``retries``) within the
deadline, the key masked in every error, and the breaker (``TierHealth``): any failure, a timeout included,
opens it; while it is open calls fail at once, and one probe per back-off finds out whether it is back.
Failures are ``UpstreamError`` naming the model: 503 (unavailable), 504 (timeout) or 502 (an answer that
cannot be trusted: not the shape, a text unscored, a score that is NaN or infinite — never cached).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np
import orjson

from ragcache.core.health import TierHealth
from ragcache.models.remote.credentials import ApiKey
from ragcache.outbound import CallLimits, Upstream
from ragcache.rerank.base import score_space

__all__ = ["RemoteReranker", "RERANK_APIS", "DEFAULT_MAX_ANSWER_BYTES"]

RERANK_APIS = ("tei", "cohere")
# Texts per call: text-embeddings-inference refuses more than its max_client_batch_size, 32 by default.
TEXTS_PER_CALL = 32
# 32 scores take about 2 KB in either shape; 1 MiB leaves room for usage and metadata, not for a flood.
DEFAULT_MAX_ANSWER_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 5.0


class RemoteReranker:
    def __init__(
        self,
        url: str,
        model: str,
        *,
        api: Literal["tei", "cohere"] = "tei",
        timeout_s: float = 10.0,
        retries: int = 1,
        api_key: str | None = None,
        revision: str = "unversioned",
        max_length: int = 512,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        health: TierHealth | None = None,
        transport: Any = None,
    ):
        if api not in RERANK_APIS:
            raise ValueError(f"api must be one of {RERANK_APIS}, got {api!r}")
        self.name = model
        self.url = url
        self.api = api
        self.max_answer_bytes = max_answer_bytes
        self.health = health or TierHealth()
        limits = CallLimits(timeout_s=timeout_s, connect_timeout_s=min(CONNECT_TIMEOUT_S, timeout_s), max_retries=retries)
        self._upstream = Upstream(model, limits, api_key=ApiKey(api_key) if api_key else None, health=self.health,
                                  transport=transport)
        # The space names the endpoint (without any credentials in the URL) and a revision label: a provider
        # can change the model behind a name, and a new label keeps old scores from being served for it.
        parts = urlsplit(url)
        endpoint = f"{parts.scheme}://{parts.hostname}:{parts.port or ''}{parts.path}"
        self.space = score_space(f"remote:{api}:{endpoint}#{model}", revision, max_length)

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Scores in pair order; pairs of one query go together, ``TEXTS_PER_CALL`` texts a call."""
        scores = np.empty(len(pairs), dtype=np.float32)
        query_to_positions: dict[str, list[int]] = {}
        for position, (query, _) in enumerate(pairs):
            query_to_positions.setdefault(query, []).append(position)
        for query, positions in query_to_positions.items():
            for start in range(0, len(positions), TEXTS_PER_CALL):
                chunk = positions[start : start + TEXTS_PER_CALL]
                scores[chunk] = self._score_one_query(query, [pairs[p][1] for p in chunk])
        return scores

    def _score_one_query(self, query: str, texts: list[str]) -> np.ndarray:
        return self._upstream.post(self.url, self._body(query, texts), parse=lambda body: _parse(self.api, body, len(texts)),
                                   max_bytes=self.max_answer_bytes)

    def _body(self, query: str, texts: list[str]) -> dict[str, Any]:
        if self.api == "tei":
            return {"query": query, "texts": texts, "truncate": True, "raw_scores": False}
        return {"query": query, "documents": texts, "model": self.name, "return_documents": False}

    def close(self) -> None:
        self._upstream.close()


def _parse(api: str, body: bytes, num_texts: int) -> np.ndarray:
    """Scores by index from either answer shape; ``ValueError`` unless every text has one finite score."""
    payload = orjson.loads(body)
    try:
        items = payload if api == "tei" else payload["results"]
        field = "score" if api == "tei" else "relevance_score"
        index_to_score = {int(item["index"]): float(item[field]) for item in items}
        scores = np.array([index_to_score[index] for index in range(num_texts)], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the rerank answer is not the {api} shape, or misses a text: {type(exc).__name__} {exc}") from None
    if not np.isfinite(scores).all():
        raise ValueError("the rerank answer holds a NaN or infinite score")
    with np.errstate(over="ignore"):
        narrowed = scores.astype(np.float32)
    if not np.isfinite(narrowed).all():
        raise ValueError("the rerank answer holds a score beyond float32's range")
    return narrowed
