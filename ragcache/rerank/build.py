"""The served rerankers from settings (their score caches are built from the table of levels: ``ragcache.build``)."""

from __future__ import annotations

from ragcache.errors import ConfigError
from ragcache.rerank.base import Reranker
from ragcache.rerank.local import CrossEncoderReranker
from ragcache.rerank.remote import RemoteReranker
from ragcache.settings import Settings

__all__ = ["build_rerankers"]


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
