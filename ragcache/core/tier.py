"""The one small interface every cache level implements (its breaker is ``ragcache.core.health``).

Levels are batched only: ``get_many`` answers a whole batch of keys in one operation (one slab gather, one
Redis round trip, one Milvus query) and ``put_many`` stores a whole batch. Hits come back as positions plus
one stacked tensor rather than a list with ``None`` per key, so no per-key objects are built on the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Expiring", "Figured", "MayHold", "Tier", "TierHits"]


@dataclass(frozen=True)
class TierHits:
    """The keys a level found: ``vectors[i]`` is the vector of ``keys[index[i]]``, ``index`` ascending.
    Misses are absent."""

    index: list[int]
    vectors: torch.Tensor

    @classmethod
    def none(cls, dim: int, dtype: torch.dtype) -> TierHits:
        return cls(index=[], vectors=torch.empty((0, dim), dtype=dtype))


@runtime_checkable
class Tier(Protocol):
    """A cache level. Remote levels raise ``TierUnavailableError`` when they fail; the cache makes it a miss.

    A level's name, who else sees what it holds (this process, the host's processes, the fleet), its write
    linger and its admission are the deployment's table of levels (``ragcache.build.LEVELS``) to say, not the
    tier's: ``ragcache.core.levels.Levels`` is told them. ``name`` is only the default for a tier used bare (in
    tests, or a cache built without the table).

    What a level may offer beyond this is declared below, one protocol per ability (``MayHold``, ``Expiring``,
    ``Figured``), and the walk asks ``isinstance`` once, when it is built.
    """

    name: str

    def get_many(self, keys: Sequence[str]) -> TierHits: ...

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class MayHold(Protocol):
    """A level whose every call costs (Milvus) and that can say, without a call, that it holds none of ``keys``
    (its collection is empty): False, and the walk does not ask it (the misses count as bypassed)."""

    def may_hold(self, keys: Sequence[str]) -> bool: ...


@runtime_checkable
class Expiring(Protocol):
    """A level whose entries expire ``ttl_s`` seconds after they are written (None: kept until evicted): how a
    miss on it is told apart as expired (``ragcache.core.causes``)."""

    ttl_s: float | None


@runtime_checkable
class Figured(Protocol):
    """A level that keeps figures of itself, shown in ``Levels.states`` beside its health: ``num_corrupt`` (values
    dropped as corrupt), ``used_bytes`` against ``capacity_bytes``, ``num_evicted``, and a generational store's
    ``num_rotations`` and ``num_lost`` (each only where the level has it)."""

    def figures(self) -> dict[str, int]: ...
