"""A level kept per space (L3: one Milvus collection per space id), routed by the space id inside each key.

A key is ``rc:<space_id>:<text_hash>``, so the key itself says which space's store it belongs to. Routing by
it, rather than by the space the cache uses now, means a write always lands with the space it was computed
under: after a model-drift switch (``ragcache.models.drift``), a late write of the old generation goes to the old
generation's collection, never the new one's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from ragcache.core.tier import Figured, MayHold, Tier, TierHits

__all__ = ["PerSpaceTier"]

# rc:<space_id>:<32 hex of the text hash>
_HASH_CHARS = 32


class PerSpaceTier:
    """Delegates each batch to the level of its keys' space, made on first use by ``make(space_id)``."""

    def __init__(self, make: Callable[[str], Tier], *, dim: int, dtype: torch.dtype, name: str = "L3"):
        self.name = name
        self._make = make
        self.dim = dim
        self.dtype = dtype
        self._tiers: dict[str, Tier] = {}
        self._lock = threading.Lock()

    def tier_for(self, space_id: str) -> Tier:
        tier = self._tiers.get(space_id)
        if tier is None:
            with self._lock:
                tier = self._tiers.get(space_id)
                if tier is None:
                    tier = self._tiers[space_id] = self._make(space_id)
        return tier

    @property
    def num_corrupt(self) -> int:
        return sum(tier.figures().get("num_corrupt", 0) for tier in list(self._tiers.values()) if isinstance(tier, Figured))

    def figures(self) -> dict[str, int]:
        """Rows dropped as corrupt in every space's level (``ragcache.core.tier.Figured``)."""
        return {"num_corrupt": self.num_corrupt}

    def may_hold(self, keys: Sequence[str]) -> bool:
        """Whether any of the keys' spaces may hold a row (a level that says so of itself, ``MilvusTier.may_hold``)."""
        for space_id in _by_space(keys):
            tier = self.tier_for(space_id)
            if not isinstance(tier, MayHold) or tier.may_hold(()):
                return True
        return False

    def get_many(self, keys: Sequence[str]) -> TierHits:
        groups = _by_space(keys)
        if len(groups) <= 1:  # the usual case: one request, one space
            return self.tier_for(next(iter(groups))).get_many(keys) if groups else TierHits.none(self.dim, self.dtype)
        found: list[tuple[int, torch.Tensor]] = []
        for space_id, positions in groups.items():
            hits = self.tier_for(space_id).get_many([keys[p] for p in positions])
            found.extend((positions[i], vector) for i, vector in zip(hits.index, hits.vectors))
        if not found:
            return TierHits.none(self.dim, self.dtype)
        found.sort(key=lambda item: item[0])
        return TierHits(index=[p for p, _ in found], vectors=torch.stack([v for _, v in found]))

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None:
        for space_id, positions in _by_space(keys).items():
            if len(positions) == len(keys):
                self.tier_for(space_id).put_many(keys, vectors)
            else:
                self.tier_for(space_id).put_many([keys[p] for p in positions], vectors[positions])

    def close(self) -> None:
        for tier in list(self._tiers.values()):
            tier.close()


def _by_space(keys: Sequence[str]) -> dict[str, list[int]]:
    """Positions of the keys per space id, in order."""
    groups: dict[str, list[int]] = {}
    for position, key in enumerate(keys):
        groups.setdefault(key[3 : -_HASH_CHARS - 1], []).append(position)
    return groups
