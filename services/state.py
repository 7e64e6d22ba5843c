"""What the running service holds: settings, shared stores, one cache per served model, the knowledge base."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ragcache.build import build_cache, drift_monitor, load_encoder, load_remote_encoders
from ragcache.cache import EmbeddingCache
from ragcache.drift import DriftMonitor
from ragcache.errors import ConfigError, InvalidInputError, NotFoundError
from ragcache.knowledge import KnowledgeBase
from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig
from ragcache.rerank.build import build_rerankers, score_cache
from ragcache.rerank.scores import RerankCache
from ragcache.settings import Settings
from ragcache.stores import Stores
from ragcache.tiers.compute import PACKAGED_MODEL

log = logging.getLogger(__name__)

# Short names clients commonly send for the packaged model (OpenAI-style clients send just a name).
ALIASES = {"all-MiniLM-L6-v2": PACKAGED_MODEL, "default": PACKAGED_MODEL}


@dataclass
class ServiceState:
    settings: Settings
    stores: Stores
    caches: dict[str, EmbeddingCache]
    knowledge: KnowledgeBase | None
    prefixes: PrefixRegistry
    rerankers: dict[str, RerankCache] = field(default_factory=dict)  # served name -> reranker behind its cache
    drift: DriftMonitor | None = None

    @classmethod
    def open(cls, settings: Settings) -> ServiceState:
        stores = Stores.open(settings)
        caches: dict[str, EmbeddingCache] = {}
        rerankers: dict[str, RerankCache] = {}
        try:
            for encoder in load_remote_encoders(settings):
                if encoder.name in ALIASES:
                    encoder.close()
                    raise ConfigError(f"remote model name {encoder.name!r} is taken: it names the packaged local model")
                caches[encoder.name] = build_cache(settings, stores, encoder, on_close=encoder.close)
            # A remote model may be the default (RAGCACHE_MODEL=<its name>): no local model is loaded for it.
            for model in settings.models:
                if model not in caches:
                    caches[model] = build_cache(settings, stores, load_encoder(settings, model))
            for reranker in build_rerankers(settings):
                rerankers[reranker.name] = score_cache(settings, stores, reranker)
            # Before the first request: a model that changed since the last run never serves old vectors.
            drift = drift_monitor(settings, stores, caches).start()
        except BaseException:
            for closable in [*caches.values(), *rerankers.values()]:
                closable.close()  # type: ignore[attr-defined]
            stores.close()
            raise
        knowledge = KnowledgeBase(stores.milvus, redis=stores.redis) if stores.milvus is not None else None
        # Prefixes live in Redis so every replica shares them; without Redis, in a file under data_dir.
        prefixes = PrefixRegistry.create(
            PrefixRegistryConfig(
                file_path=settings.data_dir / "prefixes.json",
                warm_budget_per_minute=settings.prefix_warm_budget_per_minute,
                min_rewarm_interval_s=settings.prefix_min_rewarm_interval_s,
                max_rewarm_interval_s=settings.prefix_max_rewarm_interval_s,
            ),
            redis_client=stores.redis,  # type: ignore[arg-type]
        )
        prefixes.start()
        return cls(settings, stores, caches, knowledge, prefixes, rerankers, drift=drift)

    @property
    def default_model(self) -> str:
        return self.settings.model

    def cache_for(self, model: str | None) -> EmbeddingCache:
        """The cache of ``model`` (the default when None); ``NotFoundError`` lists what is served."""
        name = ALIASES.get(model, model) if model else self.default_model
        cache = self.caches.get(name)
        if cache is None:
            served = ", ".join(self.caches)
            raise NotFoundError(f"model {model!r} is not served here; served models: {served}")
        return cache

    def reranker_for(self, model: str | None, field: str = "model") -> RerankCache:
        """The reranker named ``model`` (the first served when None); ``InvalidInputError`` naming ``field``
        when it is not served, or when no reranker is."""
        if not self.rerankers:
            raise InvalidInputError(
                "no reranker is served here: set RAGCACHE_RERANK_MODELS or RAGCACHE_RERANK_URL", field=field
            )
        reranker = self.rerankers.get(model or next(iter(self.rerankers)))
        if reranker is None:
            raise InvalidInputError(f"reranker {model!r} is not served here; served: {', '.join(self.rerankers)}", field=field)
        return reranker

    def close(self) -> None:
        """Flush queued L2/L3 writes of every cache, then close the stores (graceful shutdown)."""
        self.prefixes.close()
        if self.drift is not None:
            self.drift.close()
        for cache in self.caches.values():
            cache.close()
        for reranker in self.rerankers.values():
            reranker.close()
        self.stores.close()
        log.info("ragcache service stopped; queued writes flushed")
