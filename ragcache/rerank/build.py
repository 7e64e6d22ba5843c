"""Assemble the served rerankers from settings, each behind its score cache (L1 slab, then L2 Redis)."""

from __future__ import annotations

import torch

from ragcache.core.cache import ComputeConfig, EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.errors import ConfigError
from ragcache.rerank.base import Reranker
from ragcache.rerank.local import CrossEncoderReranker
from ragcache.rerank.remote import RemoteReranker
from ragcache.rerank.scores import PairEncoder, RerankCache
from ragcache.settings import Settings
from ragcache.storage.stores import Stores
from ragcache.tiers.memory import MemoryTier
from ragcache.tiers.redis import RedisTier

__all__ = ["build_rerankers", "score_cache"]


def build_rerankers(settings: Settings) -> list[Reranker]:
    """The local cross-encoders, then the remote endpoint when one is configured."""
    rerankers: list[Reranker] = [
        CrossEncoderReranker(model, device=settings.space.device, batch_size=settings.compute.compute_batch_size)
        for model in settings.rerank.rerank_models
    ]
    if settings.rerank.rerank_url:
        if not settings.rerank.rerank_remote_model:
            raise ConfigError("rerank_url needs rerank_remote_model: the name of the model the endpoint serves")
        rerankers.append(
            RemoteReranker(
                settings.rerank.rerank_url,
                settings.rerank.rerank_remote_model,
                api=settings.rerank.rerank_api,
                timeout_s=settings.rerank.rerank_timeout_s,
                max_answer_bytes=settings.rerank.rerank_max_answer_bytes,
                api_key=settings.rerank.rerank_api_key,
                revision=settings.rerank.rerank_revision,
            )
        )
    return rerankers


def score_cache(settings: Settings, stores: Stores, reranker: Reranker) -> RerankCache:
    """The reranker behind L1 (``rerank_l1_bytes``) and L2 (the shared Redis, when on)."""
    tiers: list = [MemoryTier(settings.rerank.rerank_l1_bytes, 1, torch.float32, device="cpu")]
    if stores.redis is not None:
        tiers.append(RedisTier(stores.redis, dim=1, dtype=torch.float32, ttl_s=settings.levels.redis_ttl_s))
    levels = Levels(tiers, dim=1, dtype=torch.float32, write_behind=settings.levels.write_behind,
                    window_s=settings.service.stats_window_s, tracer=stores.tracing.tracer)
    compute = ComputeConfig(max_batch=settings.compute.compute_batch_size,
                            max_wait_s=settings.compute.compute_max_wait_ms / 1000)
    cache = EmbeddingCache(PairEncoder(reranker), levels, compute=compute)
    return RerankCache(reranker, cache)
