"""What the benchmarks of one process share: the corpus, the stream, one model, one Redis, one Milvus Lite.

Heavy objects are made on first use and only once (the model takes seconds to load; every system compared
uses that same ``SentenceTransformer``). Every vector the model computes is remembered by text, so a later
benchmark that only needs vectors *resident* somewhere (L2 for the fetch race, the stream replay for hit
rates) seeds them rather than paying the model again; timings of computation always call the model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ragcache.storage.processes import poll_until
from ragcache_bench.corpus import Corpus, ZipfStream, build_corpus, zipf_stream

__all__ = ["BenchContext", "CountingEncoder", "RecordingEncoder", "Sizes"]

BATCH_SIZE = 32


@dataclass(frozen=True)
class Sizes:
    """Workload sizes: ``--quick`` keeps ``bench all`` under ten minutes on two cores."""

    stream_batches: int  # Zipf stream length, in requests of 32
    race_batches: int  # stream prefix every system runs in the side-by-side Zipf race
    cold_batches: int  # stream prefix of ``bench cold`` (full: 20,480 texts, so L3's steady-state cost is inside)
    bare_batches: int  # batches timed for the bare model's texts/s
    repeats: int  # timed repeats behind each median
    l2_keys: int
    scale_sizes: tuple[int, ...]
    l3_scale_sizes: tuple[int, ...]
    http_seconds: float  # per load-test run
    search_documents: int
    search_queries: int

    @classmethod
    def for_mode(cls, quick: bool) -> Sizes:
        if quick:
            return cls(200, 30, 30, 6, 5, 1000, (10_000, 100_000, 1_000_000), (10_000, 100_000), 6.0, 100_000, 8)
        return cls(1000, 60, 640, 16, 9, 1000, (10_000, 100_000, 1_000_000), (10_000, 100_000, 1_000_000), 15.0, 100_000, 20)


class BenchContext:
    def __init__(self, *, quick: bool = False, seed: int = 0, workdir: str | Path | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.quick = quick
        self.seed = seed
        self.sizes = Sizes.for_mode(quick)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="ragcache-bench-"))
        self._vectors: dict[str, np.ndarray] = {}
        self._redis: Any = None  # an EmbeddedRedis, started on first use
        self._milvus: Any = None  # a ragcache.storage.stores.MilvusConnection, opened on first use
        self.service: Any = None  # a running ragcache service shared by the HTTP benchmarks (bench.service)

    # ---- workload ----------------------------------------------------------------------------------------

    @cached_property
    def corpus(self) -> Corpus:
        return build_corpus()

    @cached_property
    def stream(self) -> ZipfStream:
        return zipf_stream(len(self.corpus), self.sizes.stream_batches, batch_size=BATCH_SIZE, s=1.1, seed=self.seed)

    def batch(self, index: int) -> list[str]:
        return self.stream.texts(self.corpus, index)

    def distinct_stream_texts(self) -> list[str]:
        """The stream's distinct texts in order of first request."""
        order = dict.fromkeys(int(i) for batch in self.stream.batches for i in batch)
        return [self.corpus.passages[i] for i in order]

    def unseen_texts(self, count: int, *, skip: int = 0) -> list[str]:
        """Passages the stream never asks for, in a seeded order (for runs where every text must miss).
        The same ``skip``/``count`` always gives the same texts; disjoint ranges give disjoint texts."""
        asked = set(int(i) for batch in self.stream.batches for i in batch)
        order = np.random.default_rng(self.seed + 1).permutation(len(self.corpus))
        fresh = [self.corpus.passages[i] for i in order if int(i) not in asked]
        if skip + count > len(fresh):
            raise RuntimeError(f"only {len(fresh)} passages outside the stream, {skip + count} needed")
        return fresh[skip : skip + count]

    # ---- the model -------------------------------------------------------------------------------------------

    @cached_property
    def settings(self):
        from ragcache import Settings

        return Settings(redis_url=self.redis_url, milvus_uri=str(self.workdir / "l3.db"), data_dir=self.workdir)

    @cached_property
    def encoder(self):
        """ragcache's encoder; ``encoder.model`` is the one SentenceTransformer every system uses."""
        from ragcache import Settings, load_encoder

        return load_encoder(Settings(redis_url="off", milvus_uri="off", data_dir=self.workdir))

    @property
    def model(self):
        return self.encoder.model

    def compute(self, texts: Sequence[str]) -> np.ndarray:
        """The bare model, as a user without a cache calls it (and every vector it makes is remembered)."""
        vectors = self.model.encode(list(texts), batch_size=BATCH_SIZE, show_progress_bar=False, convert_to_numpy=True)
        for text, vector in zip(texts, vectors):
            self._vectors[text] = vector
        return vectors

    def vectors(self, texts: Sequence[str]) -> np.ndarray:
        """The model's vectors for ``texts``, computing only those never computed in this process."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        for start in range(0, len(missing), 256):
            self.compute(missing[start : start + 256])
        return np.stack([self._vectors[t] for t in texts]) if texts else np.empty((0, self.encoder.dim), np.float32)

    # ---- stores ------------------------------------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        if self._redis is None:
            from ragcache.storage.embedded_redis import EmbeddedRedis

            self._redis = EmbeddedRedis()
        return self._redis.url

    @cached_property
    def redis_client(self):
        import redis

        return redis.Redis.from_url(self.redis_url)

    @property
    def milvus(self):
        if self._milvus is None:
            from ragcache.storage.stores import open_milvus

            self._milvus = open_milvus(str(self.workdir / "l3.db"))
        return self._milvus

    def fresh_cache(self, *, l1_bytes: int | None = None, l2: bool = True, l3: bool = True, disk: bool = False, encoder=None,
                    **overrides):
        """A new cache over emptied stores: Redis flushed, the L3 collection dropped, with ``disk`` a disk level in a
        new folder of its own (closed with the cache)."""
        import uuid

        from ragcache import Stores, build_cache
        from ragcache.storage.disk_store import DiskStore

        settings = self.settings.replace(l1_bytes=l1_bytes or self.settings.levels.l1_bytes, **overrides)
        if l2:
            self.redis_client.flushdb()
        if l3:
            self.milvus.drop_collection(f"rc_{self.encoder.space.space_id}")
        store = None
        if disk:
            store = DiskStore(self.workdir / f"disk-{uuid.uuid4().hex[:8]}", capacity_bytes=settings.levels.disk_max_bytes,
                              num_generations=settings.levels.disk_generations)
        stores = Stores(self._cache_redis_client(settings) if l2 else None, self.milvus if l3 else None, disk=store)
        return build_cache(settings, stores, encoder or self.encoder, on_close=store.close if store is not None else None)

    def _cache_redis_client(self, settings):
        import redis

        # The client ragcache's Stores would open: same URL, same timeouts.
        return redis.Redis.from_url(
            self.redis_url, socket_timeout=settings.levels.redis_timeout_s, socket_connect_timeout=settings.levels.redis_timeout_s
        )

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None
        if self._milvus is not None:
            self._milvus.close()
            self._milvus = None
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> BenchContext:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class RecordingEncoder:
    """ragcache's encoder interface over the context's remembered vectors: the real model's vectors,
    computed once per process. Used where only *what* the cache computes matters (hit rates), never
    where the time of computing is measured."""

    def __init__(self, context: BenchContext):
        from ragcache.models.local import EncoderStats

        self._context = context
        self._stats_type = EncoderStats
        self.space = context.encoder.space
        self.device = context.encoder.device
        self.dim = context.encoder.dim
        self.batch_sizes: list[int] = []
        self.num_texts = 0

    def encode(self, texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:  # takes no prompt (none declared)
        self.batch_sizes.append(len(texts))
        self.num_texts += len(texts)
        return torch.from_numpy(self._context.vectors(list(texts)))

    def stats(self):
        return self._stats_type(self.num_texts, len(self.batch_sizes), 0.0, tuple(self.batch_sizes[-256:]))


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    return poll_until(predicate, timeout_s=timeout_s, interval_s=interval_s)


class CountingEncoder:
    """The real model, counting every text the cache hands it before the model's own de-duplication: what
    the cache asked to compute, which is what single flight and batching promise to keep down."""

    def __init__(self, encoder):
        self._encoder = encoder
        self.space = encoder.space
        self.device = encoder.device
        self.dim = encoder.dim
        self.texts_handed: list[str] = []
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:  # takes no prompt (none declared)
        with self._lock:
            self.texts_handed.extend(texts)
            self.batch_sizes.append(len(texts))
        return self._encoder.encode(texts)

    def stats(self):
        return self._encoder.stats()
