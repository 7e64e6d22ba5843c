"""The one small interface every reranker implements, and the typed results of a rerank.

A reranker scores (query, text) pairs: a higher score is more relevant. ``space`` names everything that can
change a score (model, revision, maximum length, the activation), exactly as an embedding space names what
can change a vector, so scores are cached under it (``ragcache.rerank.scores``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ragcache.core.keys import EmbeddingSpace

__all__ = ["Reranker", "RerankHit", "RerankResult", "score_space"]


@runtime_checkable
class Reranker(Protocol):
    """Scores pairs. A remote reranker that fails raises ``UpstreamError``; a local model that fails raises
    ``ComputeError`` (its base). ``count_tokens`` is None where the tokenizer is not known here (remote)."""

    name: str
    space: EmbeddingSpace

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray: ...

    def close(self) -> None: ...


def score_space(model: str, revision: str, max_length: int) -> EmbeddingSpace:
    """The space of a reranker's scores: one float32 per pair. ``prompt`` carries the marker ``rerank``, so
    no score space can share an id with an embedding space, even of a model at the same path."""
    return EmbeddingSpace(
        model=model, revision=revision, dtype="float32", dim=1, normalize=False, max_seq_length=max_length, prompt="rerank"
    )


@dataclass(frozen=True)
class RerankHit:
    index: int  # position of the text in the request
    score: float  # higher is more relevant; the reranker's own scale (a sigmoid in [0, 1] for cross-encoders)


@dataclass(frozen=True)
class RerankResult:
    """Hits sorted by score, best first (ties: the earlier text first), cut to ``top_n`` when one was asked."""

    model: str
    hits: tuple[RerankHit, ...]
    served: dict[str, int]  # level name -> scores it served ("compute": scored by the reranker now)

    @property
    def num_cached(self) -> int:
        return sum(count for level, count in self.served.items() if level != "compute")
