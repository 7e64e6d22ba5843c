"""L1: an exact LRU kept in one preallocated device tensor (GPU when present, else CPU)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ragcache.errors import ConfigError, InvalidInputError
from ragcache.tiers.base import TierHits

__all__ = ["MemoryTier", "resolve_device"]


def resolve_device(device: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU; anything else is passed to torch as is."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but CUDA is not available here")
    return resolved


class MemoryTier:
    """A slab ``[num_rows, dim]`` allocated once, a key -> row map, and exact least-recently-used eviction.

    The byte budget covers the slab: ``num_rows = capacity_bytes // (dim * itemsize)``, so the device memory
    used never exceeds ``capacity_bytes``. The key map lives on the host (about 150 bytes an entry).
    A batch lookup is one ``index_select`` and a batch store one ``index_copy_``. One lock guards the map and
    the slab together, so a row cannot be reused between looking it up and gathering it.
    """

    name = "L1"

    def __init__(self, capacity_bytes: int, dim: int, dtype: torch.dtype, device: str | torch.device = "cpu"):
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.dim = dim
        self.dtype = dtype
        row_bytes = dim * torch.empty((), dtype=dtype).element_size()
        self.num_rows = capacity_bytes // row_bytes
        if self.num_rows < 1:
            raise ConfigError(f"L1 capacity of {capacity_bytes} bytes holds no vector of {row_bytes} bytes")
        self.capacity_bytes = capacity_bytes
        self.slab = torch.empty((self.num_rows, dim), dtype=dtype, device=self.device)
        # OrderedDict order is recency: first = least recently used. move_to_end and popitem(last=False)
        # are O(1), which a list or deque (remove from the middle) would not be.
        self._key_to_row: OrderedDict[str, int] = OrderedDict()
        self._free_rows = list(range(self.num_rows - 1, -1, -1))
        self._lock = threading.Lock()
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._key_to_row)

    @property
    def used_bytes(self) -> int:
        return len(self._key_to_row) * self.dim * self.slab.element_size()

    @property
    def slab_bytes(self) -> int:
        return self.slab.numel() * self.slab.element_size()

    def keys_lru_first(self) -> list[str]:
        """Resident keys from least to most recently used (the order they would be evicted in)."""
        with self._lock:
            return list(self._key_to_row)

    def get_many(self, keys: Sequence[str]) -> TierHits:
        index: list[int] = []
        rows: list[int] = []
        with self._lock:
            key_to_row = self._key_to_row
            for position, key in enumerate(keys):
                row = key_to_row.get(key)
                if row is not None:
                    key_to_row.move_to_end(key)
                    index.append(position)
                    rows.append(row)
            if not rows:
                return TierHits.none(self.dim, self.dtype)
            vectors = self.slab.index_select(0, torch.tensor(rows, device=self.device))
        return TierHits(index=index, vectors=vectors)

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None:
        if vectors.shape != (len(keys), self.dim):
            raise InvalidInputError(f"expected vectors of shape ({len(keys)}, {self.dim}), got {tuple(vectors.shape)}")
        # Later duplicates win, and only the last num_rows keys can be resident after the batch anyway.
        last_position = {key: position for position, key in enumerate(keys)}
        batch = list(last_position.items())[-self.num_rows :]
        rows: list[int] = []
        with self._lock:
            key_to_row = self._key_to_row
            for key, _ in batch:
                row = key_to_row.get(key)
                if row is not None:
                    key_to_row.move_to_end(key)
                else:
                    row = self._free_rows.pop() if self._free_rows else self._evict_one()
                    key_to_row[key] = row
                rows.append(row)
            if len(batch) == len(keys):
                source = vectors  # every key once, all kept: the rows are already in order, no gather needed
            else:
                positions = torch.tensor([position for _, position in batch], device=vectors.device)
                source = vectors.index_select(0, positions)
            source = source.to(device=self.device, dtype=self.dtype)
            self.slab.index_copy_(0, torch.tensor(rows, device=self.device), source)

    def _evict_one(self) -> int:
        _, row = self._key_to_row.popitem(last=False)
        self.num_evicted += 1
        return row

    def clear(self) -> None:
        with self._lock:
            self._key_to_row.clear()
            self._free_rows = list(range(self.num_rows - 1, -1, -1))

    def close(self) -> None:
        self.clear()
