"""The registry's config from the service's settings: the one place the ``prefix_*`` options become a
``PrefixRegistryConfig``.

A setting ``prefix_<name>`` sets the config field ``<name>`` by that name alone (lists become tuples), so a new
knob is one settings field and one config field; only the few fields below that are derived or renamed are
written out.
"""

from __future__ import annotations

import dataclasses

from ragcache.engines import EventsConfig
from ragcache.errors import ConfigError
from ragcache.settings import Settings

from .config import PrefixRegistryConfig

__all__ = ["kv_events_of", "registry_config", "restricts_targets"]

# Settings whose config field has another name.
RENAMED = {"prefix_vllm_endpoints": "endpoints", "prefix_max_per_tenant": "max_prefixes_per_tenant"}
# Settings turned into config values by a function of their own, below.
DERIVED = {"prefix_kv_events", "prefix_tenant_targets"}


def registry_config(settings: Settings) -> PrefixRegistryConfig:
    """Every ``prefix_*`` setting in the config, the registry's file under ``data_dir``, and whether prefix
    targets are restricted (``restricts_targets``)."""
    config_fields = {item.name for item in dataclasses.fields(PrefixRegistryConfig)}
    given: dict[str, object] = {}
    for name, value in settings.prefixes.model_dump().items():
        if name in DERIVED:
            continue
        target = RENAMED.get(name, name.removeprefix("prefix_"))
        if target not in config_fields:
            raise ConfigError(f"setting {name} has no field {target!r} in PrefixRegistryConfig")
        given[target] = tuple(value) if isinstance(value, list) else value
    return PrefixRegistryConfig(
        **given,  # type: ignore[arg-type]
        file_path=settings.levels.data_dir / "prefixes.json",
        restrict_targets=restricts_targets(settings),
        tenant_targets={tenant: tuple(urls) for tenant, urls in settings.prefixes.prefix_tenant_targets.items()},
        kv_events=kv_events_of(settings),
    )


def restricts_targets(settings: Settings) -> bool:
    """Whether prefixes may name only the URLs the operator listed (docs/SECURITY.md): always when the service has
    API keys, may bind beyond loopback, or the operator listed any vLLM endpoint or target. Only the open,
    loopback-only service with nothing listed (``make serve``: every caller is on this machine and holds every
    scope) accepts any plain http(s) URL, as the library does."""
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
