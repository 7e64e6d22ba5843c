"""A remote rerank API over HTTP: text-embeddings-inference's ``/rerank`` (``tei``) or the Cohere shape that
Infinity and Cohere serve (``cohere``).

    tei:    {"query", "texts", "truncate", "raw_scores": false} -> [{"index", "score"}]
    cohere: {"query", "documents", "model", "return_documents": false} -> {"results": [{"index", "relevance_score"}]}

Every call has a deadline (``timeout_s``); a connection that cannot be made is tried ``retries`` more times,
a timeout or a bad answer is not (the server may still be working). Any failure opens the breaker
(``TierHealth``): while it is open, calls fail at once with ``TierUnavailableError`` instead of waiting on a
server that is down, and one probe per back-off finds out whether it is back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import numpy as np

from ragcache.errors import TierUnavailableError
from ragcache.redact import redact_text, redact_url
from ragcache.rerank.base import score_space
from ragcache.tiers.base import TierHealth

__all__ = ["RemoteReranker", "RERANK_APIS"]

log = logging.getLogger(__name__)

RERANK_APIS = ("tei", "cohere")
# Texts per call: text-embeddings-inference refuses more than its max_client_batch_size, 32 by default.
TEXTS_PER_CALL = 32
TIER = "reranker"


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
        health: TierHealth | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        if api not in RERANK_APIS:
            raise ValueError(f"api must be one of {RERANK_APIS}, got {api!r}")
        self.name = model
        self.url = url
        self._shown_url = redact_url(url)  # what errors and logs show: never credentials in the URL
        self.api = api
        self.retries = retries
        self.health = health or TierHealth()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)
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
        if not self.health.should_try():
            raise TierUnavailableError(TIER, f"{self.name} at {self._shown_url} is down ({self.health.last_error}); retrying with back-off")
        try:
            scores = _parse(self.api, self._post(self._body(query, texts)), len(texts))
        except TierUnavailableError as exc:
            if self.health.record_failure(exc):
                log.warning("reranker %s is down: %s", self.name, exc)
            raise
        if self.health.record_success():
            log.warning("reranker %s is back", self.name)
        return scores

    def _body(self, query: str, texts: list[str]) -> dict[str, Any]:
        if self.api == "tei":
            return {"query": query, "texts": texts, "truncate": True, "raw_scores": False}
        return {"query": query, "documents": texts, "model": self.name, "return_documents": False}

    def _post(self, body: dict[str, Any]) -> Any:
        for attempt in range(self.retries + 1):
            try:
                response = self._http.post(self.url, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt < self.retries:
                    continue  # the request never reached the server: safe to send again
                raise TierUnavailableError(TIER, f"{self._shown_url} cannot be reached: {self._shown(exc)}") from exc
            except httpx.HTTPError as exc:
                raise TierUnavailableError(TIER, f"{self._shown_url} failed: {self._shown(exc)}") from exc
            if not response.is_success:
                raise TierUnavailableError(TIER, f"{self._shown_url} answered {response.status_code}: {response.text[:300]}")
            try:
                return response.json()
            except ValueError as exc:
                raise TierUnavailableError(TIER, f"{self._shown_url} answered something that is not JSON") from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _shown(self, exc: Exception) -> str:
        return f"{type(exc).__name__}: {redact_text(str(exc), self.url)}"

    def close(self) -> None:
        self._http.close()


def _parse(api: str, payload: Any, num_texts: int) -> np.ndarray:
    """Scores by index from either answer shape; an answer that does not score every text is a failure."""
    try:
        items = payload if api == "tei" else payload["results"]
        field = "score" if api == "tei" else "relevance_score"
        index_to_score = {int(item["index"]): float(item[field]) for item in items}
        return np.array([index_to_score[index] for index in range(num_texts)], dtype=np.float32)
    except (KeyError, TypeError, ValueError) as exc:
        raise TierUnavailableError(TIER, f"the rerank answer is not the {api} shape, or misses a text: {exc!r}") from exc
