"""What the registry answers about its prefixes: each warm's outcome, a registration, and a prefix with its residency
on each endpoint. The records themselves are in :mod:`.model`, the counters in :mod:`.stats`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .model import Prefix

__all__ = ["EndpointResidency", "PrefixView", "RegisterResult", "WarmOutcome", "WarmResult"]


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
class RegisterResult:
    """A registration: the stored prefix, warnings about its content, and its first warm."""

    prefix: Prefix
    created: bool
    new_version: bool
    warnings: tuple[str, ...]
    warm: WarmResult | None  # the target's warm
    # Every endpoint's warm (the target's first); empty when nothing was warmed.
    warms: tuple[WarmResult, ...] = ()
