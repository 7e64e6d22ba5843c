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

__all__ = ["Tier", "TierHits"]


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

    Who else sees what a level holds (this process, the host's processes, the fleet) is the deployment's table
    of levels (``ragcache.build.LEVELS``) to say, not the tier's: the cache is told which levels the fleet sees
    (``fleet_levels``), and single flight across processes publishes in the first of them below L1.

    A level whose every call costs (Milvus) may also offer ``may_hold(keys) -> bool``: False means it holds
    none of them (its collection is empty), and the walk does not ask it (the misses count as bypassed).
    """

    name: str

    def get_many(self, keys: Sequence[str]) -> TierHits: ...

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None: ...

    def close(self) -> None: ...
