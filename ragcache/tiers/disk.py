"""The disk level: vectors of one embedding space in the host's ``DiskStore`` (LMDB generations under
``<data_dir>/disk``), between L1 and the shared levels.

Named ``disk`` (``X-Cache-Disk``, ``level="disk"`` in metrics): the names L1, L2 and L3 keep meaning what they
meant (device, Redis, Milvus), so dashboards and headers that read them are unchanged. Values are the codec's
(``ragcache.tiers.codec``, the bytes L2 stores): a torn or corrupt one is deleted, counted (``num_corrupt``)
and a miss, never a wrong vector. Every model's tier shares the one store of the process (``Stores.disk``),
and every process of the host shares its folder: ``num_evicted``, ``num_rotations`` and ``num_lost`` are that
store's counts in this process (the same under every model), ``num_corrupt`` this tier's own. While the store is
unavailable (its volume under the free-space margin, or a write failed for want of space: ``DiskStore``) every call
raises ``TierUnavailableError``: a miss, counted as the level's error, and the level down in ``/health``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import lmdb
import torch

from ragcache.core.tier import TierHits
from ragcache.errors import TierUnavailableError
from ragcache.storage.disk_store import DiskStore
from ragcache.tiers.codec import decode_values, encode_rows

__all__ = ["DiskTier"]

log = logging.getLogger(__name__)


class DiskTier:
    """One space's view of the host's disk store: ``get_many`` is one read transaction per generation asked,
    ``put_many`` one write transaction (rotating the store's generations when the newest is full)."""

    name = "disk"

    def __init__(self, store: DiskStore, *, dim: int, dtype: torch.dtype):
        self.store = store
        self.dim = dim
        self.dtype = dtype
        self.num_corrupt = 0

    def get_many(self, keys: Sequence[str]) -> TierHits:
        try:
            values = self.store.get_many([key.encode() for key in keys])
        except lmdb.Error as exc:
            raise TierUnavailableError(self.name, f"disk store failed: {exc}") from exc
        valid, vectors, corrupt = decode_values(values, self.dtype, self.dim)
        if corrupt:
            self._drop_corrupt([keys[position] for position in corrupt])
        return TierHits(index=valid, vectors=vectors)

    def _drop_corrupt(self, keys: list[str]) -> None:
        self.num_corrupt += len(keys)
        log.warning("disk: %d corrupt or foreign value(s) deleted, e.g. %s", len(keys), keys[0])
        try:
            self.store.delete([key.encode() for key in keys])
        except lmdb.Error as exc:  # the read already made them misses; deleting is only so they are not read again
            log.warning("disk: deleting corrupt values failed: %s", exc)

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None:
        values = encode_rows(vectors, self.dtype, self.dim)
        try:
            self.store.put_many([(key.encode(), value) for key, value in zip(keys, values)])
        except lmdb.Error as exc:
            raise TierUnavailableError(self.name, f"disk store failed: {exc}") from exc

    @property
    def used_bytes(self) -> int:
        return self.store.figures().used_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.store.capacity_bytes

    @property
    def num_evicted(self) -> int:
        return self.store.figures().num_evicted

    @property
    def num_rotations(self) -> int:
        """Generations the store started because the newest was full (each dropped the oldest beyond the count)."""
        return self.store.figures().num_rotations

    @property
    def num_lost(self) -> int:
        """Generations the store dropped because their file could not be opened or read (corrupt)."""
        return self.store.figures().num_lost

    def figures(self) -> dict[str, int]:
        """This tier's corrupt values and the host store's figures (``ragcache.core.tier.Figured``), read at once."""
        store = self.store.figures()
        return {"num_corrupt": self.num_corrupt, "used_bytes": store.used_bytes, "capacity_bytes": self.capacity_bytes,
                "num_evicted": store.num_evicted, "num_rotations": store.num_rotations, "num_lost": store.num_lost}

    def close(self) -> None:
        """The store belongs to whoever opened it (the shared ``Stores``); nothing to release here."""
