"""One assembly: what a deployment holds, opened in order on one exit stack and closed in reverse.

The order is the order of need: the stores; each model's encoder (a remote model when the settings configure one
of that name, else the local one: decided here, once); each model's cache over the levels of
``ragcache.build.LEVELS``; the rerankers behind their score caches; the drift monitor, started before the first
lookup; the knowledge base; the prefix registry. A part that fails to open closes every part opened before it.

``open_cache``, Ray's actors and the HTTP service are views of one ``Deployment``: each opens the parts it uses
and looks things up in it; none assembles anything itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from ragcache.build import build_cache, drift_monitor, load_encoder, score_cache
from ragcache.core.cache import EmbeddingCache
from ragcache.errors import ConfigError
from ragcache.models.drift import DriftMonitor
from ragcache.models.local import ModelEncoder
from ragcache.models.remote import RemoteEncoder, RemoteModel, load_models, open_remote_encoder
from ragcache.prefixes import PrefixRegistry
from ragcache.prefixes.settings import registry_config
from ragcache.rerank import RerankCache, build_rerankers
from ragcache.retrieval import DocumentQuota, KnowledgeBase
from ragcache.settings import Settings
from ragcache.storage.stores import Stores, milvus_free_bytes

__all__ = ["Deployment", "open_cache", "open_encoder", "remote_models", "served_models"]


def remote_models(settings: Settings) -> dict[str, RemoteModel]:
    """The remote models the settings configure (``models_json``, ``models_file``), by name."""
    models = load_models(settings.space.models_json, settings.space.models_file)
    if settings.access.tenant_cache_namespaces and any(model.pass_through_auth for model in models):
        # A tenant's cache wraps the model's encoder; a caller's key would not reach it (docs/providers.md).
        raise ConfigError("pass_through_auth cannot be combined with RAGCACHE_TENANT_CACHE_NAMESPACES")
    return {model.name: model for model in models}


def served_models(settings: Settings) -> list[str]:
    """Every model a deployment of ``settings`` serves: the remote ones, then the local ones no remote model names
    (a remote model may be the default, ``RAGCACHE_MODEL=<its name>``: then no local model is loaded for it)."""
    return _served(settings, remote_models(settings))


def _served(settings: Settings, remote: Mapping[str, RemoteModel]) -> list[str]:
    return [*remote, *(model for model in settings.space.models if model not in remote)]


def open_encoder(settings: Settings, name: str, remote: Mapping[str, RemoteModel],
                 environ: Mapping[str, str] | None = None) -> ModelEncoder | RemoteEncoder:
    """The encoder of model ``name``: the remote model of that name when one is configured, else the local model.
    API keys are read from ``environ`` (the process environment by default)."""
    if name in remote:
        return open_remote_encoder(remote[name], os.environ if environ is None else environ)
    return load_encoder(settings, name)


@dataclass
class Deployment:
    """The parts a deployment opened; ``close`` closes them in the reverse order of opening (every cache's
    queued writes are flushed before the stores close)."""

    settings: Settings
    stores: Stores
    caches: dict[str, EmbeddingCache]
    drift: DriftMonitor
    rerankers: dict[str, RerankCache] = field(default_factory=dict)
    knowledge: KnowledgeBase | None = None
    prefixes: PrefixRegistry | None = None
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)

    @classmethod
    def open(cls, settings: Settings, *, models: Sequence[str] | None = None, rerankers: bool = False,
             knowledge: bool = False, prefixes: bool = False) -> Deployment:
        """Open the caches of ``models`` (default: every served model, ``served_models``) over one set of stores,
        and, when asked, the rerankers, the knowledge base (needs L3's Milvus; None without it) and the prefix
        registry (started)."""
        remote = remote_models(settings)
        stack = ExitStack()
        try:
            stores = Stores.open(settings)
            stack.callback(stores.close)
            caches: dict[str, EmbeddingCache] = {}
            for name in _served(settings, remote) if models is None else models:  # the models file read once
                encoder = open_encoder(settings, name, remote)
                stack.callback(encoder.close)  # a remote one's connections and threads, after its cache flushed
                caches[name] = build_cache(settings, stores, encoder)
                stack.callback(caches[name].close)
            score_caches: dict[str, RerankCache] = {}
            for reranker in build_rerankers(settings) if rerankers else ():
                score_caches[reranker.name] = score_cache(settings, stores, reranker)
                stack.callback(score_caches[reranker.name].close)
            # Before the first lookup: a model that changed since the last run never serves the old vectors.
            monitor = drift_monitor(settings, stores, caches).start()
            stack.callback(monitor.close)
            knowledge_base = None
            if knowledge and stores.milvus is not None:
                quota = DocumentQuota(settings.knowledge.collection_max_documents, settings.knowledge.tenant_max_documents,
                                      settings.knowledge.ingest_min_free_bytes, milvus_free_bytes(settings))
                knowledge_base = KnowledgeBase(stores.milvus, redis=stores.redis,
                                               result_max_bytes=settings.knowledge.result_cache_max_bytes,
                                               keyword_index=settings.knowledge.keyword_index, quota=quota)
            registry = None
            if prefixes:
                # Prefixes live in Redis so every replica shares them; without Redis, in a file under data_dir.
                registry = PrefixRegistry.create(registry_config(settings), redis_client=stores.redis)  # type: ignore[arg-type]
                stack.callback(registry.close)
                registry.start()
        except BaseException:
            stack.close()
            raise
        return cls(settings, stores, caches, monitor, score_caches, knowledge_base, registry, stack)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_cache(settings: Settings | None = None) -> EmbeddingCache:
    """A ready cache for the default model (local, or a remote one ``settings.space.model`` names), owning the
    deployment opened for it (its stores and drift check close with it).

    >>> with open_cache(Settings(redis_url="off", milvus_uri="off")) as cache:
    ...     vectors = cache.embed(["hello"])
    """
    settings = settings or Settings.load()
    deployment = Deployment.open(settings, models=[settings.space.model])
    cache = deployment.caches[settings.space.model]
    cache.release_on_close(deployment.close)
    return cache
