"""Fakes for unit tests of logic only, passed in through constructors (never patched into modules)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

import torch
import xxhash

from ragcache.core.keys import EmbeddingSpace
from ragcache.models.local import EncoderStats


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


class SwappableEncoder(HashEncoder):
    """A stand-in upstream whose model can be swapped behind the same name (fault injection for drift):
    ``version`` seeds every vector, so two versions give clearly distinct vectors for every text.

    ``hold`` (an Event, cleared) blocks encode calls of texts other than the drift canaries until set, so a
    test can swap the model and run the drift check while a request is in the middle of computing."""

    def __init__(self, dim: int = 8, dtype: str = "float32", model: str = "fake/swappable"):
        super().__init__(dim=dim, dtype=dtype)
        # A name of its own per test: fingerprints and L3 collections outlive a test in a session's Milvus.
        self.space = dataclasses.replace(self.space, model=model)
        self.version = 0
        self.device = torch.device("cpu")
        self.hold: threading.Event | None = None
        self.entered = threading.Event()

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        from ragcache.models.drift import CANARY_TEXTS

        version = self.version  # the model that computes this call, taken when it starts
        if self.hold is not None and not set(texts) <= set(CANARY_TEXTS):
            self.entered.set()
            self.hold.wait(timeout=30)
        with self._lock:
            self.calls.append(list(texts))
        return self.vectors(texts, version)

    def vectors(self, texts: Sequence[str], version: int | None = None) -> torch.Tensor:
        """What model ``version`` (default: the current one) computes for ``texts``."""
        version = self.version if version is None else version
        seeds = [xxhash.xxh3_64_intdigest(t.encode()) ^ (version * 0x9E3779B97F4A7C15 % 2**64) for t in texts]
        rows = [torch.randn(self.space.dim, generator=torch.Generator().manual_seed(seed % 2**63)) for seed in seeds]
        return (torch.stack(rows) if rows else torch.empty(0, self.space.dim)).to(getattr(torch, self.space.dtype))
