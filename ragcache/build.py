"""Assemble caches from settings: the one place that knows which concrete level goes where."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ragcache.core.cache import EmbeddingCache
from ragcache.core.flight import RedisFlight
from ragcache.errors import ConfigError
from ragcache.models.drift import DriftGuard, DriftMonitor
from ragcache.models.fingerprints import Fingerprints
from ragcache.models.local import TORCH_DTYPES, ModelEncoder
from ragcache.models.remote import RemoteEncoder, load_models, open_remote_encoder
from ragcache.settings import Settings
from ragcache.storage.stores import Stores
from ragcache.tiers.memory import MemoryTier
from ragcache.tiers.milvus import MilvusTier
from ragcache.tiers.milvus_budget import L3Budget
from ragcache.tiers.redis import RedisTier
from ragcache.tiers.spaces import PerSpaceTier

__all__ = ["build_cache", "drift_monitor", "open_cache", "load_encoder", "load_remote_encoders"]


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


def load_remote_encoders(settings: Settings, environ: Mapping[str, str] | None = None) -> list[RemoteEncoder]:
    """An encoder per configured remote model (``models_json``, ``models_file``), keys read from ``environ``
    (the process environment by default): the start-up, where names of variables become their values."""
    models = load_models(settings.space.models_json, settings.space.models_file)
    if settings.access.tenant_cache_namespaces and any(model.pass_through_auth for model in models):
        # A tenant's cache wraps the model's encoder; a caller's key would not reach it (docs/providers.md).
        raise ConfigError("pass_through_auth cannot be combined with RAGCACHE_TENANT_CACHE_NAMESPACES")
    environ = os.environ if environ is None else environ
    encoders: list[RemoteEncoder] = []
    try:
        for model in models:
            encoders.append(open_remote_encoder(model, environ))
    except BaseException:
        for encoder in encoders:
            encoder.close()
        raise
    return encoders


def build_cache(
    settings: Settings,
    stores: Stores,
    encoder: ModelEncoder | RemoteEncoder,
    *,
    on_close=None,
) -> EmbeddingCache:
    """L1 (device slab) -> L2 (Redis, unless off) -> L3 (Milvus, unless off) -> the encoder's model: one cache per
    model, serving every scope (tenant, prompt: ``ragcache.core.scope``); keys differ by space, so one L1 budget
    serves them all."""
    space = encoder.space
    dtype = TORCH_DTYPES[space.dtype]
    tiers: list = [MemoryTier(settings.levels.l1_bytes, space.dim, dtype, device=encoder.device)]
    if stores.redis is not None:
        tiers.append(
            RedisTier(
                stores.redis,
                dim=space.dim,
                dtype=dtype,
                ttl_s=settings.levels.redis_ttl_s,
                refresh_ttl_on_hit=settings.levels.redis_refresh_ttl_on_hit,
            )
        )
    if stores.milvus is not None:
        milvus = stores.milvus
        # One collection per space id, the key's: a drift switch moves to another collection, and a late
        # write of the old generation still goes to the old one (ragcache.tiers.spaces).
        budget = L3Budget(max_rows=settings.levels.l3_max_rows, max_age_s=settings.levels.l3_max_age_s)
        per_space = lambda space_id: MilvusTier(milvus, space_id=space_id, dim=space.dim, dtype=dtype, budget=budget)  # noqa: E731
        tiers.append(PerSpaceTier(per_space, dim=space.dim, dtype=dtype))
    return EmbeddingCache(
        encoder,
        tiers,
        write_behind=settings.levels.write_behind,
        # L3, the last level when there is one, gathers its writes (settings.levels.l3_write_linger_ms); L2 writes at once.
        write_linger_s={len(tiers) - 1: settings.levels.l3_write_linger_ms / 1000} if stores.milvus is not None else None,
        # A remote model takes as many texts as fill its upstream requests in parallel (max_inputs x concurrency).
        compute_max_batch=getattr(encoder, "max_batch", settings.compute.compute_batch_size),
        compute_max_wait_s=settings.compute.compute_max_wait_ms / 1000,
        compute_max_pending=settings.compute.compute_max_pending,
        window_s=settings.service.stats_window_s,
        device=encoder.device,
        on_close=on_close,
        flight=_flight(settings, stores),
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


def _default_encoder(settings: Settings) -> ModelEncoder | RemoteEncoder:
    """``settings.space.model``: a configured remote model of that name (then no local model is loaded), else local."""
    models = load_models(settings.space.models_json, settings.space.models_file)
    if any(model.name == settings.space.model for model in models):
        remote = {encoder.name: encoder for encoder in load_remote_encoders(settings)}
        for name, encoder in remote.items():
            if name != settings.space.model:
                encoder.close()
        return remote[settings.space.model]
    return load_encoder(settings)


def open_cache(settings: Settings | None = None) -> EmbeddingCache:
    """A ready cache for the default model (local, or a remote one ``settings.space.model`` names), owning its
    stores (closed with the cache).

    >>> with open_cache(Settings(redis_url="off", milvus_uri="off")) as cache:
    ...     vectors = cache.embed(["hello"])
    """
    settings = settings or Settings.load()
    stores = Stores.open(settings)
    monitor = None
    encoder = None

    def close() -> None:
        if monitor is not None:
            monitor.close()
        if isinstance(encoder, RemoteEncoder):
            encoder.close()  # its connections and upstream threads
        stores.close()

    try:
        encoder = _default_encoder(settings)
        cache = build_cache(settings, stores, encoder, on_close=close)
    except BaseException:
        close()
        raise
    try:
        # Checked before the first lookup: a model changed since the last run never serves the old vectors.
        monitor = drift_monitor(settings, stores, {settings.space.model: cache}).start()
    except BaseException:
        cache.close()
        raise
    return cache
