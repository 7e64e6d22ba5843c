"""Fakes for unit tests of logic only, passed in through constructors (never patched into modules)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch
import xxhash

from ragcache.keys import EmbeddingSpace
from ragcache.tiers.compute import EncoderStats


class HashEncoder:
    """A deterministic stand-in model: each text's vector is derived from its hash. Counts what it computes."""

    def __init__(self, dim: int = 8, dtype: str = "float32", delay_s: float = 0.0):
        self.space = EmbeddingSpace(
            model="fake/hash", revision="0", dtype=dtype, dim=dim, normalize=False, max_seq_length=128
        )
        self.delay_s = delay_s
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        with self._lock:
            self.calls.append(list(texts))
        time.sleep(self.delay_s)
        rows = [torch.Generator().manual_seed(xxhash.xxh3_64_intdigest(t.encode())) for t in texts]
        vectors = torch.stack([torch.randn(self.space.dim, generator=g) for g in rows]) if rows else torch.empty(0, self.space.dim)
        return vectors.to(getattr(torch, self.space.dtype))

    @property
    def num_texts(self) -> int:
        return sum(len(call) for call in self.calls)

    def stats(self) -> EncoderStats:
        return EncoderStats(self.num_texts, len(self.calls), 0.001 * self.num_texts, tuple(len(c) for c in self.calls))
