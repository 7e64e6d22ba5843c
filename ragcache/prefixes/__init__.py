"""KV-prefix registry: named prompt prefixes kept resident in vLLM's prefix cache.

Errors (all under :class:`ragcache.errors.RagCacheError`):

    InvalidInputError       a bad name, template or slots, or a target URL the operator did not list (.allow)
    PrefixLimitError        a registration over a bound (.quota): the text's size, the tenant's prefixes, the rate
    NotFoundError           an unknown prefix name (a ``PrefixName``'s public name: a tenant's own, never the stored one)
    TierUnavailableError    the store (Redis or the local file) failed
    TargetUnavailableError  vLLM or an LMCache controller failed; the registry itself never lets it
                            escape from register/warm/tick (the target is reported down instead)
    TargetBadResponseError  ... answering what vLLM never sends (a /tokenize without its count): register
                            lets it escape, naming vLLM (the service answers 502)
"""

from ragcache.engines import EventsConfig, TargetBadResponseError, TargetUnavailableError, VLLMClient

from .config import PrefixRegistryConfig
from .metrics import PrefixMetricsCollector, register_prefix_metrics
from .model import MAX_USES_PER_REPORT, Prefix, PrefixName, PrefixSpec, PromptForm, Target, VolatileSpan, check_name
from .quota import PrefixLimitError
from .registry import PrefixRegistry
from .results import EndpointResidency, PrefixView, RegisterResult, WarmOutcome, WarmResult
from .routing import RouteCandidate, RouteResult
from .stats import EventsStats, PrefixStats, RegistryStats, TargetStats
from .store import FilePrefixStore, PrefixStore, RedisPrefixStore, make_store
from .text import Chunk, assemble_prompt, find_volatile, render_messages, render_text, template_head

__all__ = [
    "MAX_USES_PER_REPORT",
    "Chunk",
    "EndpointResidency",
    "EventsConfig",
    "EventsStats",
    "FilePrefixStore",
    "Prefix",
    "PrefixMetricsCollector",
    "PrefixLimitError",
    "PrefixName",
    "PrefixRegistry",
    "PrefixRegistryConfig",
    "PrefixSpec",
    "PrefixStats",
    "PrefixStore",
    "PrefixView",
    "PromptForm",
    "RedisPrefixStore",
    "RegisterResult",
    "RegistryStats",
    "RouteCandidate",
    "RouteResult",
    "Target",
    "TargetStats",
    "TargetBadResponseError",
    "TargetUnavailableError",
    "VLLMClient",
    "VolatileSpan",
    "WarmOutcome",
    "WarmResult",
    "assemble_prompt",
    "check_name",
    "find_volatile",
    "make_store",
    "register_prefix_metrics",
    "render_messages",
    "render_text",
    "template_head",
]
