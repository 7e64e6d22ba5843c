"""What the running service holds: settings, shared stores, one cache per served model, the knowledge base; and each
request's view of a cache (``TenantCaches``: its tenant and prompt)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ragcache import ConfigError, Deployment, InvalidInputError, NotFoundError, remote_models, served_models
from ragcache.core import UNSCOPED, EmbeddingCache, Prompt, Scope
from ragcache.models import PACKAGED_MODEL, DriftMonitor, known_prompts, load_models
from ragcache.prefixes import PrefixRegistry
from ragcache.rerank import RerankCache
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
    """The service's view of its ``Deployment``: lookups by the names requests carry (models with their aliases and
    prompts, rerankers); the deployment opens and closes everything."""

    deployment: Deployment
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
        served = served_models(settings)
        unknown = sorted(set(settings.space.model_prompts) - set(served))
        if unknown:  # remote models may have named prompts too: prepended to each text they send
            raise ConfigError(f"model_prompts names models that are not served: {unknown}; served: {served}")
        unknown = sorted(set(settings.space.model_backends) - set(settings.space.models))
        if unknown:  # a backend is for local models only
            raise ConfigError(f"model_backends names models that are not served locally: {unknown}; local: {settings.space.models}")
        taken = sorted(set(remote_models(settings)) & set(ALIASES))
        if taken:
            raise ConfigError(f"remote model name {taken[0]!r} is taken: it names the packaged local model")
        return cls(Deployment.open(settings, rerankers=True, knowledge=True, prefixes=True))

    @property
    def settings(self) -> Settings:
        return self.deployment.settings

    @property
    def stores(self) -> Stores:
        return self.deployment.stores

    @property
    def caches(self) -> dict[str, EmbeddingCache]:
        return self.deployment.caches

    @property
    def rerankers(self) -> dict[str, RerankCache]:
        return self.deployment.rerankers

    @property
    def drift(self) -> DriftMonitor:
        return self.deployment.drift

    @property
    def knowledge(self) -> KnowledgeBase | None:
        return self.deployment.knowledge

    @property
    def prefixes(self) -> PrefixRegistry:
        assert self.deployment.prefixes is not None, "the service's deployment opens the prefix registry"
        return self.deployment.prefixes

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
        self.deployment.close()
        log.info("ragcache service stopped; queued writes flushed")


class TenantCaches:
    """The cache a request embeds through: the model's, seen from the request's scope (``EmbeddingCache.scoped``):
    its prompt and (``tenant_cache_namespaces``) its tenant. No cache, threads or levels of its own; its traffic
    is counted both in the model's figures and, per tenant, in ``namespace_stats`` (/stats). A lookup over the
    state, as the state's own are, so it lives beside them (one module on every request's path, not two).

    Tenants: each sees only its own collections and prompt prefixes, and (optionally) hits only its own cache entries.

    Names are resolved in the library (``ragcache.retrieval.names``): a tenant's collection ``docs`` is stored as
    ``<tenant>--docs``, its prefix ``system`` as ``<tenant>--system``, and a request for another tenant's collection or
    prefix looks up a name that does not exist: 404, never 403, so names do not leak. A key without a tenant sees the
    stored names (the operator's view). The knowledge base and the prefix registry raise their errors with the name
    the caller sent (``CollectionName``, ``PrefixName``), so no message is rewritten here.

    With ``tenant_cache_namespaces`` a tenant's requests carry it in their scope (``ragcache.core.scope``): the space
    carries the tenant as ``namespace``, so the same model and vectors sit under other keys, and a text another
    tenant embedded is still a miss (no hit to time, no ``X-Cache-L1`` to read). One cache per model serves every
    tenant: one L1 budget, one set of threads and breakers; L3 keeps each namespace in its own collection.
    """

    def __init__(self, state: ServiceState, *, enabled: bool):
        self.state = state
        self.enabled = enabled

    def scope(self, tenant: str | None) -> Scope:
        """The scope ``tenant``'s requests carry into a cache (the embedding and the rerank score caches alike)."""
        return Scope(tenant) if self.enabled and tenant is not None else UNSCOPED

    def cache_for(self, model: str | None, tenant: str | None, prompt_name: str | None = None, *, optional: bool = False) -> EmbeddingCache:
        return self.state.cache_for(model, prompt_name, optional=optional, tenant=self.scope(tenant).tenant)
