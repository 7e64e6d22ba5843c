"""What the running service holds: settings, shared stores, one cache per served model, the knowledge base."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ragcache import ConfigError, InvalidInputError, NotFoundError, build_cache, drift_monitor, load_encoder, load_remote_encoders
from ragcache.core import UNSCOPED, EmbeddingCache, Prompt, Scope
from ragcache.models import PACKAGED_MODEL, DriftMonitor, known_prompts, load_models
from ragcache.prefixes import EventsConfig, PrefixRegistry, PrefixRegistryConfig
from ragcache.rerank import RerankCache, build_rerankers, score_cache
from ragcache.retrieval import KnowledgeBase
from ragcache.settings import Settings
from ragcache.storage import Stores

log = logging.getLogger(__name__)

# Short names clients commonly send for the packaged model (OpenAI-style clients send just a name).
ALIASES = {"all-MiniLM-L6-v2": PACKAGED_MODEL, "default": PACKAGED_MODEL}


def local_models(settings: Settings) -> list[str]:
    """The embedding models this process loads and runs itself: those of ``settings.space.models`` that no remote
    model (``models_json``/``models_file``) names."""
    remote = {model.name for model in load_models(settings.space.models_json, settings.space.models_file)}
    return [model for model in settings.space.models if model not in remote]


@dataclass
class ServiceState:
    settings: Settings
    stores: Stores
    caches: dict[str, EmbeddingCache]
    knowledge: KnowledgeBase | None
    prefixes: PrefixRegistry
    rerankers: dict[str, RerankCache] = field(default_factory=dict)  # served name -> reranker behind its cache
    drift: DriftMonitor | None = None
    # Each served model's named prompts (its own, overlaid with RAGCACHE_MODEL_PROMPTS), resolved once at start-up:
    # every /search and /documents request asks for one or two.
    prompts: dict[str, dict[str, Prompt]] = field(init=False)

    def __post_init__(self) -> None:
        self.prompts = {
            model: {name: Prompt(name, text) for name, text in
                    known_prompts(cache.encoder, self.settings.space.model_prompts.get(model)).items()}
            for model, cache in self.caches.items()
        }

    @classmethod
    def open(cls, settings: Settings) -> ServiceState:
        # Remote models (ragcache.models.remote) may have named prompts too: prepended to each text they send.
        served = [*settings.space.models, *(model.name for model in load_models(settings.space.models_json, settings.space.models_file))]
        unknown = sorted(set(settings.space.model_prompts) - set(served))
        if unknown:
            raise ConfigError(f"model_prompts names models that are not served: {unknown}; served: {served}")
        unknown = sorted(set(settings.space.model_backends) - set(settings.space.models))
        if unknown:  # a backend is for local models only
            raise ConfigError(f"model_backends names models that are not served locally: {unknown}; local: {settings.space.models}")
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
            for model in local_models(settings):
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
        knowledge = (
            KnowledgeBase(
                stores.milvus,
                redis=stores.redis,
                result_max_bytes=settings.knowledge.result_cache_max_bytes,
                keyword_index=settings.knowledge.keyword_index,
            )
            if stores.milvus is not None
            else None
        )
        # Prefixes live in Redis so every replica shares them; without Redis, in a file under data_dir.
        prefixes = PrefixRegistry.create(
            PrefixRegistryConfig(
                file_path=settings.levels.data_dir / "prefixes.json",
                warm_budget_per_minute=settings.prefixes.prefix_warm_budget_per_minute,
                warm_budget_per_tenant_per_minute=settings.prefixes.prefix_warm_budget_per_tenant_per_minute,
                min_rewarm_interval_s=settings.prefixes.prefix_min_rewarm_interval_s,
                max_rewarm_interval_s=settings.prefixes.prefix_max_rewarm_interval_s,
                endpoints=tuple(settings.prefixes.prefix_vllm_endpoints),
                restrict_targets=restricts_prefix_targets(settings),
                allowed_targets=tuple(settings.prefixes.prefix_allowed_targets),
                tenant_targets={tenant: tuple(urls) for tenant, urls in settings.prefixes.prefix_tenant_targets.items()},
                max_text_bytes=settings.prefixes.prefix_max_text_bytes,
                max_prefixes_per_tenant=settings.prefixes.prefix_max_per_tenant,
                registrations_per_minute=settings.prefixes.prefix_registrations_per_minute,
                kv_events=kv_events_of(settings),
                lease_ttl_s=settings.prefixes.prefix_lease_ttl_s,
                warm_priority=settings.prefixes.prefix_warm_priority,
                warm_max_waiting=settings.prefixes.prefix_warm_max_waiting,
                warm_max_running=settings.prefixes.prefix_warm_max_running,
                warm_max_defer_s=settings.prefixes.prefix_warm_max_defer_s,
            ),
            redis_client=stores.redis,  # type: ignore[arg-type]
        )
        prefixes.start()
        return cls(settings, stores, caches, knowledge, prefixes, rerankers, drift=drift)

    @property
    def default_model(self) -> str:
        return self.settings.space.model

    def cache_for(self, model: str | None, prompt_name: str | None = None, *, optional: bool = False,
                  tenant: str | None = None) -> EmbeddingCache:
        """The cache of ``model`` (the default when None); ``NotFoundError`` lists what is served. Seen from the
        request's scope (``ragcache.core.scope``): ``tenant``'s keys, and ``prompt_name``, the model's named prompt;
        a name the model does not have is an ``InvalidInputError`` naming ``prompt_name``, or (``optional``) no
        prompt. One cache per model serves every scope."""
        name = ALIASES.get(model, model) if model else self.default_model
        cache = self.caches.get(name)
        if cache is None:
            served = ", ".join(self.caches)
            raise NotFoundError(f"model {model!r} is not served here; served models: {served}", field="model")
        scope = Scope(tenant, self._prompt(name, prompt_name, optional=optional))
        return cache if scope == UNSCOPED else cache.scoped(scope)

    def _prompt(self, model: str, prompt_name: str | None, *, optional: bool) -> Prompt | None:
        if prompt_name is None:
            return None
        prompt = self.prompts[model].get(prompt_name)
        if prompt is None:
            if optional:
                return None
            raise InvalidInputError(
                f"model {model!r} has no prompt named {prompt_name!r}; its prompts: {sorted(self.prompts[model]) or 'none'} "
                "(its own, and RAGCACHE_MODEL_PROMPTS)",
                field="prompt_name",
            )
        return prompt

    def prompts_of(self, model: str) -> dict[str, str]:
        """The named prompts of a served model: its own, overlaid with RAGCACHE_MODEL_PROMPTS."""
        return {name: prompt.text for name, prompt in self.prompts[model].items()}

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


def restricts_prefix_targets(settings: Settings) -> bool:
    """Whether prefixes may name only the URLs the operator listed (docs/SECURITY.md, issue 27 item 2): always when
    the service has API keys, may bind beyond loopback, or the operator listed any vLLM endpoint or target. Only the
    open, loopback-only service with nothing listed (``make serve``: every caller is on this machine and holds
    every scope) accepts any plain http(s) URL, as the library does."""
    access, prefixes = settings.access, settings.prefixes
    return bool(access.api_key or access.api_keys or access.api_keys_file or access.insecure
                or prefixes.prefix_vllm_endpoints or prefixes.prefix_allowed_targets or prefixes.prefix_tenant_targets)


def kv_events_of(settings: Settings) -> dict[str, EventsConfig]:
    """RAGCACHE_PREFIX_KV_EVENTS as the registry's configs: each endpoint's publisher and replay socket."""
    configs = {}
    for url, given in settings.prefixes.prefix_kv_events.items():
        unknown = set(given) - {"endpoint", "replay_endpoint", "topic"}
        if "endpoint" not in given or unknown:
            raise ConfigError(f"prefix_kv_events[{url!r}] needs an 'endpoint' (tcp://host:port), optionally "
                              f"'replay_endpoint' and 'topic'{'; unknown: ' + ', '.join(sorted(unknown)) if unknown else ''}")
        configs[url] = EventsConfig(given["endpoint"], given.get("replay_endpoint"), given.get("topic", ""))
    return configs
