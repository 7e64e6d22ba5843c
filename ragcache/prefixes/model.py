"""Plain values that cross the registry's boundaries: targets, prefixes, warm results, stats."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ragcache.engines import PromptForm, Target
from ragcache.errors import InvalidInputError
from ragcache.retrieval.names import TenantName

__all__ = [
    "MAX_USES_PER_REPORT",
    "check_name",
    "PrefixName",
    "PromptForm",
    "Target",
    "PrefixSpec",
    "Prefix",
    "EndpointResidency",
    "PrefixView",
    "VolatileSpan",
    "WarmOutcome",
    "WarmResult",
    "PrefixStats",
    "TargetStats",
    "EndpointStats",
    "EventsStats",
    "RegistryStats",
    "RegisterResult",
    "content_hash",
]


# A name travels in URL paths (/prefixes/{name}), so it is limited to characters that need no escaping and
# cannot be a dot segment; fullmatch, because "$" would also accept a trailing newline.
MAX_NAME_CHARS = 128
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}")
# Uses one report may add (``POST /prefixes/{name}/uses``, ``PrefixRegistry.record_use``): a client reports what it
# rendered since its last report, far below this; one call adding a billion would only falsify the counters.
MAX_USES_PER_REPORT = 100_000


def check_name(name: object, field: str = "name") -> str:
    """``name`` when it is a valid prefix name; :class:`InvalidInputError` naming ``field`` otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInputError(f"{field} must be 1-{MAX_NAME_CHARS} of [A-Za-z0-9._-], starting with a letter or digit",
                                field=field)
    return name


@dataclass(frozen=True)
class PrefixName(TenantName):
    """A prefix's name as its caller knows it and as the store keeps it (``ragcache.retrieval.names``): a tenant's
    ``system`` is stored as ``<tenant>--system``. The registry takes one wherever it takes a name."""

    FIELD = "name"
    MAX_CHARS = MAX_NAME_CHARS

    @staticmethod
    def check(name: object, field: str) -> str:
        # The public name is checked, not the stored one: '-x' is no prefix name, though 'acme---x' would pass.
        return check_name(name, field)


@dataclass(frozen=True)
class PrefixSpec:
    """What a caller registers. ``text`` is a system prompt, or a template whose ``{slots}`` follow
    its constant head when ``is_template`` is set; the head is the prefix that is kept warm."""

    name: str
    text: str
    target: Target
    is_template: bool = False
    form: PromptForm = PromptForm.COMPLETION
    lmcache_controller_url: str | None = None
    pinned: bool = True
    # More vLLM replicas (base URLs) serving ``target.model``: the prefix is kept warm on each of them.
    endpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prefix:
    """A registered prefix, as stored (in Redis or the local file) and shared by every replica."""

    name: str
    text: str
    target: Target
    is_template: bool
    form: PromptForm
    lmcache_controller_url: str | None
    pinned: bool
    version: int
    # Tokens of the constant head; None until a tokenizer or vLLM could count them.
    num_tokens: int | None
    content_hash: str
    created_at: float
    updated_at: float
    # Replicas beside ``target`` (absent in records stored before fleets existed).
    endpoints: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the storage format)."""
        out = dataclasses.asdict(self)
        out["form"] = self.form.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Prefix:
        """Inverse of :meth:`to_json`; keys it does not know are left out (``GET /prefixes/{name}`` adds
        ``residency``, and a later version may store more)."""
        known = {field.name for field in dataclasses.fields(Prefix)}
        fields = {key: value for key, value in data.items() if key in known}
        fields["target"] = Target(**fields["target"])
        fields["form"] = PromptForm(fields["form"])
        fields["endpoints"] = tuple(fields.get("endpoints") or ())
        return cls(**fields)


@dataclass(frozen=True)
class EndpointResidency:
    """How much of a prefix one vLLM endpoint holds, by the engine's KV events (issue 30): ``events`` is ``synced``
    (the counts are exact), ``out_of_sync`` (unknown now) or ``off`` (the endpoint publishes none); the prefix's full
    blocks and how many of them the endpoint holds, when synced and known; ``keepable`` false while churn evicts it
    faster than it can be re-warmed."""

    base_url: str
    events: str
    resident_blocks: int | None
    num_blocks: int | None
    keepable: bool


@dataclass(frozen=True)
class PrefixView(Prefix):
    """A stored prefix with its residency on each of its endpoints (the target first), as ``GET /prefixes/{name}``
    answers; never stored."""

    residency: tuple[EndpointResidency, ...] = ()


def content_hash(text: str, target: Target, is_template: bool, form: PromptForm) -> str:
    """BLAKE2b-128 over everything that changes what vLLM caches; a change means a new version. Not xxh3: a
    tenant's text chooses it, and a chosen collision would pass a changed prefix off as the version warmed."""
    h = hashlib.blake2b(digest_size=16)
    for part in (target.base_url, target.model, form.value, "T" if is_template else "S", text):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


@dataclass(frozen=True)
class VolatileSpan:
    """Content inside a prefix that changes from request to request and so defeats caching."""

    kind: str
    start: int
    end: int
    text: str

    def message(self) -> str:
        """A warning that names the span."""
        return f"volatile {self.kind} {self.text!r} at characters {self.start}-{self.end}"


class WarmOutcome(str, Enum):
    """What one warm request found."""

    PRIME = "prime"  # first warm of a version or after the target came back: nothing to compare yet
    RESIDENT = "resident"  # the prefix's KV blocks were still cached
    EVICTED = "evicted"  # some or all of them had to be recomputed
    ERROR = "error"  # vLLM was unreachable or answered an error
    SKIPPED = "skipped"  # not sent: the warm budget was spent or the target is backing off


@dataclass(frozen=True)
class WarmResult:
    """Outcome of one warm request for one prefix version."""

    name: str
    version: int
    outcome: WarmOutcome
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None
    # The vLLM base URL that was warmed.
    endpoint: str = ""


@dataclass(frozen=True)
class EndpointStats:
    """One prefix on one vLLM endpoint, as this process's warms found it."""

    base_url: str
    # As the last judged warm found it: True resident, False evicted (and loaded again by that warm);
    # None before a re-warm has been judged.
    resident: bool | None
    last_outcome: WarmOutcome | None
    last_warm_at: float | None
    num_warms: int
    num_resident: int
    num_evicted: int
    num_errors: int
    num_skipped: int
    residency_rate: float | None
    rewarm_interval_s: float
    # By the engine's KV events (issue 30): "synced" (exact), "out_of_sync" (unknown now), "off" (none published);
    # the prefix's full blocks and how many of them the endpoint holds, when synced and known.
    events: str = "off"
    resident_blocks: int | None = None
    num_blocks: int | None = None
    # False while churn evicts the prefix faster than it can be re-warmed (no warm is sent for it then).
    keepable: bool = True
    num_warms_avoided: int = 0
    # Why the engine cannot keep it, each with the figure that shows it (:mod:`.reasons`).
    why_not_cached: tuple[str, ...] = ()


@dataclass(frozen=True)
class PrefixStats:
    """Per-prefix counters of this process."""

    name: str
    version: int
    num_tokens: int | None
    pinned: bool
    num_warms: int
    num_resident: int
    num_evicted: int
    num_errors: int
    num_skipped: int
    # Resident warms / (resident + evicted) warms; None until a re-warm has been judged.
    residency_rate: float | None
    last_outcome: WarmOutcome | None
    last_warm_at: float | None
    rewarm_interval_s: float
    num_uses: int
    # Tokens an LMCache controller reported pinned for this version; None without a controller.
    lmcache_pinned_tokens: int | None = None
    # Per vLLM endpoint (the target first); the counters above are their sums.
    endpoints: tuple[EndpointStats, ...] = ()


@dataclass(frozen=True)
class TargetStats:
    """Health and prefix-cache counters of one vLLM target, as last scraped from its /metrics."""

    base_url: str
    up: bool
    num_failures: int
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    # hits / queries of vLLM's own counters (tokens); None before any query.
    prefix_cache_hit_rate: float | None
    block_size: int | None


@dataclass(frozen=True)
class EventsStats:
    """One endpoint's KV-event feed as this process sees it (:mod:`.trust`): ``state`` is ``synced``, ``syncing``,
    ``out_of_sync`` or ``untrusted``; the warms that checked what its events claimed, those that did not find it, and
    the publishers that came back with another stream (each clearing its index)."""

    base_url: str
    state: str
    trusted: bool
    num_checks: int
    num_disagreements: int
    num_new_streams: int


@dataclass(frozen=True)
class RegistryStats:
    """Everything `/stats` shows about prefixes."""

    prefixes: tuple[PrefixStats, ...]
    targets: tuple[TargetStats, ...]
    num_warms_sent: int
    num_warms_deferred: int
    # Due warms held back while their endpoint reported users waiting or running (warm_max_waiting/_running).
    num_warms_held_busy: int = 0
    # Due timer warms not sent because the engine's KV events showed the prefix whole.
    num_warms_avoided: int = 0
    # Each endpoint that publishes KV events.
    events: tuple[EventsStats, ...] = ()
    # The fleet's warm budget a minute as sized from the engines' figures (:mod:`.budget`); None: the configured one.
    warm_budget_per_minute: int | None = None


@dataclass(frozen=True)
class RegisterResult:
    """A registration: the stored prefix, warnings about its content, and its first warm."""

    prefix: Prefix
    created: bool
    new_version: bool
    warnings: tuple[str, ...]
    warm: WarmResult | None  # the target's warm
    # Every endpoint's warm (the target's first); empty when nothing was warmed.
    warms: tuple[WarmResult, ...] = ()
