"""Build one model's cache, or one reranker's score cache, from settings: the table of levels, and the one place that
knows which concrete level goes where. ``ragcache.deployment`` opens whole deployments from these parts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ragcache.core.cache import ComputeConfig, EmbeddingCache
from ragcache.core.encoder import capabilities_of
from ragcache.core.flight import RedisFlight
from ragcache.core.keys import EmbeddingSpace
from ragcache.core.levels import Levels
from ragcache.core.tier import Tier
from ragcache.models.drift import DriftGuard, DriftMonitor
from ragcache.models.fingerprints import Fingerprints
from ragcache.models.local import TORCH_DTYPES, ModelEncoder
from ragcache.models.remote import RemoteEncoder
from ragcache.rerank.base import Reranker
from ragcache.rerank.scores import PairEncoder, RerankCache
from ragcache.settings import Settings
from ragcache.storage.stores import Stores
from ragcache.tiers.disk import DiskTier
from ragcache.tiers.memory import MemoryTier
from ragcache.tiers.milvus import MilvusTier
from ragcache.tiers.milvus_budget import L3Budget, default_max_rows
from ragcache.tiers.redis import RedisTier
from ragcache.tiers.spaces import PerSpaceTier

__all__ = ["LEVELS", "LevelRow", "build_cache", "build_levels", "drift_monitor", "load_encoder", "score_cache"]


def load_encoder(settings: Settings, model: str | None = None) -> ModelEncoder:
    """The local model ``model`` (default: ``settings.space.model``) on its backend (``model_backend(s)``)."""
    name = model or settings.space.model
    revision = settings.space.model_revision if model in (None, settings.space.model) else None
    backend = settings.space.model_backends.get(name, settings.space.model_backend)
    # What every local backend takes alike; the backend adds only what is its own.
    shared: dict[str, Any] = dict(
        revision=revision,
        dtype=settings.space.dtype,
        normalize=settings.space.normalize,
        max_seq_length=settings.space.max_seq_length,
        prompt=settings.space.prompt,
        text_normalization=settings.space.text_normalization,
        batch_size=settings.compute.compute_batch_size,
    )
    if backend != "torch":
        from ragcache.models.onnx import OnnxEncoder  # onnxruntime is imported only when asked for

        return OnnxEncoder(name, backend=backend, cache_dir=settings.levels.data_dir / "onnx", **shared)
    return ModelEncoder(name, device=settings.space.device, **shared)


@dataclass(frozen=True)
class LevelRow:
    """One level of the table: its ``name`` (what headers, metrics, /stats and the settings call it), ``reach``
    (who else sees what it holds: this process, the host's processes, the fleet; single flight across processes
    publishes in the first fleet level below L1), ``make`` (its tier for one model, or None when the settings and
    stores leave it off), ``write_linger_ms`` (how long its write-behind gathers writes into one call) and
    ``on_reuse`` (whether it stores only vectors that proved reuse, ``ragcache.core.levels``) and ``scores`` (its
    tier for one reranker's score cache, ``score_cache``; None: the level keeps no scores). The cache knows a
    level by these columns, never by its place in the walk; the row's name is the level's, whatever its tier's
    own default (``Tier.name``)."""

    name: str
    reach: Literal["process", "host", "fleet"]
    make: Callable[[Settings, Stores, EmbeddingSpace, torch.device], Tier | None]
    write_linger_ms: Callable[[Settings], float] = lambda settings: 0.0
    on_reuse: Callable[[Settings], bool] = lambda settings: False
    scores: Callable[[Settings, Stores, EmbeddingSpace, torch.device], Tier | None] | None = None


def _l1(settings: Settings, stores: Stores, space: EmbeddingSpace, device: torch.device) -> Tier:
    return MemoryTier(settings.levels.l1_bytes, space.dim, TORCH_DTYPES[space.dtype], device=device)


def _disk(settings: Settings, stores: Stores, space: EmbeddingSpace, device: torch.device) -> Tier | None:
    if stores.disk is None:
        return None
    return DiskTier(stores.disk, dim=space.dim, dtype=TORCH_DTYPES[space.dtype])


def _l1_scores(settings: Settings, stores: Stores, space: EmbeddingSpace, device: torch.device) -> Tier:
    return MemoryTier(settings.rerank.rerank_l1_bytes, space.dim, TORCH_DTYPES[space.dtype], device=device)


def _l2(settings: Settings, stores: Stores, space: EmbeddingSpace, device: torch.device) -> Tier | None:
    if stores.redis is None:
        return None
    return RedisTier(stores.redis, dim=space.dim, dtype=TORCH_DTYPES[space.dtype], ttl_s=settings.levels.redis_ttl_s,
                     refresh_ttl_on_hit=settings.levels.redis_refresh_ttl_on_hit)


def _l2_scores(settings: Settings, stores: Stores, space: EmbeddingSpace, device: torch.device) -> Tier | None:
    if stores.redis is None:
        return None
    return RedisTier(stores.redis, dim=space.dim, dtype=TORCH_DTYPES[space.dtype], ttl_s=settings.levels.redis_ttl_s)


def _l3(settings: Settings, stores: Stores, space: EmbeddingSpace, device: torch.device) -> Tier | None:
    milvus = stores.milvus
    if milvus is None:
        return None
    dtype = TORCH_DTYPES[space.dtype]
    # One collection per space id, the key's: a drift switch moves to another collection, and a late write of
    # the old generation still goes to the old one (ragcache.tiers.spaces).
    # Unset: bounded all the same, by the volume (ragcache.tiers.milvus_budget.default_max_rows); 0: no bound.
    max_rows = settings.levels.l3_max_rows
    if max_rows is None:
        max_rows = default_max_rows(getattr(milvus, "uri", ""), space.dim, settings.levels.data_dir)
    budget = L3Budget(max_rows=max_rows or None, max_age_s=settings.levels.l3_max_age_s)
    recheck_s = settings.levels.l3_empty_recheck_s
    per_space = lambda space_id: MilvusTier(milvus, space_id=space_id, dim=space.dim, dtype=dtype, budget=budget,  # noqa: E731
                                            empty_recheck_s=recheck_s)
    return PerSpaceTier(per_space, dim=space.dim, dtype=dtype)


# The levels, fastest first: the one table a deployment's levels come from, the embedding caches' and the score
# caches'. Adding a level is a row here, its tier in ragcache/tiers and its settings; nothing in ragcache/core knows
# which levels exist. Scores (four bytes each) stay off the disk and Milvus: recomputing one after Redis forgets it
# is cheaper than a durable store for it.
LEVELS: tuple[LevelRow, ...] = (
    LevelRow("L1", "process", _l1, scores=_l1_scores),
    LevelRow("disk", "host", _disk),
    LevelRow("L2", "fleet", _l2, scores=_l2_scores),
    LevelRow("L3", "fleet", _l3, write_linger_ms=lambda settings: settings.levels.l3_write_linger_ms,
             on_reuse=lambda settings: settings.levels.l3_on_reuse),
)


def build_cache(
    settings: Settings,
    stores: Stores,
    encoder: ModelEncoder | RemoteEncoder,
    *,
    on_close=None,
) -> EmbeddingCache:
    """The levels of ``LEVELS`` that the settings and stores turn on, then the encoder's model: one cache per
    model, serving every scope (tenant, prompt: ``ragcache.core.scope``); keys differ by space, so one L1
    budget serves them all."""
    compute = ComputeConfig(
        # A remote model takes as many texts as fill its upstream requests in parallel (max_inputs x concurrency).
        max_batch=capabilities_of(encoder).max_batch or settings.compute.compute_batch_size,
        max_wait_s=settings.compute.compute_max_wait_ms / 1000,
        max_pending=settings.compute.compute_max_pending,
    )
    levels = build_levels(settings, stores, encoder.space, encoder.device)
    return EmbeddingCache(encoder, levels, compute=compute, device=encoder.device, on_close=on_close,
                          flight=_flight(settings, stores))


def score_cache(settings: Settings, stores: Stores, reranker: Reranker) -> RerankCache:
    """The reranker behind the levels of ``LEVELS`` that keep scores (L1 of ``rerank_l1_bytes``, then the shared
    Redis when on), on the CPU."""
    levels = build_levels(settings, stores, reranker.space, torch.device("cpu"), scores=True)
    compute = ComputeConfig(max_batch=settings.compute.compute_batch_size,
                            max_wait_s=settings.compute.compute_max_wait_ms / 1000)
    return RerankCache(reranker, EmbeddingCache(PairEncoder(reranker), levels, compute=compute))


def build_levels(settings: Settings, stores: Stores, space: EmbeddingSpace, device: torch.device,
                 rows: tuple[LevelRow, ...] = LEVELS, *, scores: bool = False) -> Levels:
    """The ``Levels`` of ``rows`` that the settings and stores turn on, for vectors of ``space`` on ``device``
    (``scores``: a score cache's, from the rows' ``scores`` tiers): each level's name, linger, admission and reach
    from its row."""
    made = [(row, row.scores if scores else row.make) for row in rows]
    built = [(row, tier) for row, make in made if make is not None and (tier := make(settings, stores, space, device)) is not None]
    below_first = [row for row, _ in built[1:]]  # L1 is written at once and stores every vector
    return Levels(
        [tier for _, tier in built],
        names=[row.name for row, _ in built],
        dim=space.dim,
        dtype=TORCH_DTYPES[space.dtype],
        write_behind=settings.levels.write_behind,
        write_linger_s={row.name: row.write_linger_ms(settings) / 1000 for row in below_first if row.write_linger_ms(settings)},
        admit_on_reuse=[row.name for row in below_first if row.on_reuse(settings)],
        fleet_levels=[row.name for row, _ in built if row.reach == "fleet"],
        window_s=settings.service.stats_window_s,
        tracer=stores.tracing.tracer,
    )


def drift_monitor(settings: Settings, stores: Stores, caches: dict[str, EmbeddingCache]) -> DriftMonitor:
    """The drift check of every model (``ragcache.models.drift``), fingerprints kept in L2 and L3; not started.

    With ``drift_check`` off it checks nothing (every cache stays at the generation it has)."""
    fingerprints = Fingerprints.of(stores.redis, stores.milvus)
    if not settings.drift.drift_check:
        return DriftMonitor([])
    guards = [
        DriftGuard(name, cache.encoder, fingerprints, cache.generation, tolerance=settings.drift.drift_tolerance)
        for name, cache in caches.items()
    ]
    return DriftMonitor(guards, interval_s=settings.drift.drift_check_interval_s)


def _flight(settings: Settings, stores: Stores) -> RedisFlight | None:
    """Cross-replica single flight: locks in the same Redis that holds L2 (docs/replicas.md). Not with the
    embedded Redis: it belongs to this one process, so there is no other replica to share work with."""
    if stores.redis is None or stores.embedded_redis is not None or not settings.compute.single_flight:
        return None
    return RedisFlight(stores.redis, ttl_ms=settings.compute.single_flight_ttl_ms, wait_s=settings.compute.single_flight_wait_ms / 1000)  # type: ignore[arg-type]
