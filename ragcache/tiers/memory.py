"""L1: an exact LRU kept in one preallocated device tensor (GPU when present, else CPU)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from ragcache.core.keys import key_digests
from ragcache.core.tier import TierHits
from ragcache.errors import ConfigError, InvalidInputError
from ragcache.tiers.lru_index import LruIndex

__all__ = ["MemoryTier", "resolve_device"]


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` is CUDA when available, else CPU; anything else is passed to torch as is.

    A CUDA device always comes back with its index (``cuda`` -> ``cuda:0``): tensors report the indexed form,
    and ``torch.device("cuda") != torch.device("cuda:0")``, so an unindexed device would fail every
    "is this tensor on the L1's device" check on a real GPU.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} asked for, but CUDA is not available here")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


class MemoryTier:
    """A slab ``[num_rows, dim]`` allocated once, a key -> row map, and exact least-recently-used eviction.

    The byte budget covers the slab: ``num_rows = capacity_bytes // (dim * itemsize)``, so the device memory
    used never exceeds ``capacity_bytes``. The key map and recency live on the host in numpy arrays
    (``ragcache.tiers.lru_index``: about 90-110 bytes a row, no key strings kept), worked a batch at a time.
    A batch lookup is one probe of the map and one gather of rows; a batch store one scatter. On the CPU the
    gather and scatter are numpy's, on a view of the same memory: torch's would fork and join its intra-op
    threads for a few rows, which costs more than the copy, and far more when the cores are busy. One
    lock guards the map and the slab together, so a row cannot be reused between looking it up and gathering it.
    """

    name = "L1"

    def __init__(self, capacity_bytes: int, dim: int, dtype: torch.dtype, device: str | torch.device = "cpu"):
        self.device = resolve_device(device)
        self.dim = dim
        self.dtype = dtype
        row_bytes = dim * torch.empty((), dtype=dtype).element_size()
        self.num_rows = capacity_bytes // row_bytes
        if self.num_rows < 1:
            raise ConfigError(f"L1 capacity of {capacity_bytes} bytes holds no vector of {row_bytes} bytes")
        self.capacity_bytes = capacity_bytes
        self.slab = torch.empty((self.num_rows, dim), dtype=dtype, device=self.device)
        # numpy has no bfloat16: its rows travel as int16, the same bytes.
        self._storage_dtype = torch.int16 if dtype == torch.bfloat16 else dtype
        self._host_rows = self.slab.view(self._storage_dtype).numpy() if self.device.type == "cpu" else None
        self._index = LruIndex(self.num_rows)
        self._lock = threading.Lock()
        self._closed = False
        self.num_evicted = 0

    def __len__(self) -> int:
        return self._index.num_live

    @property
    def used_bytes(self) -> int:
        return self._index.num_live * self.dim * self.slab.element_size()

    def figures(self) -> dict[str, int]:
        """Bytes held against the budget, and entries evicted (``ragcache.core.tier.Figured``)."""
        return {"used_bytes": self.used_bytes, "capacity_bytes": self.capacity_bytes, "num_evicted": self.num_evicted}

    @property
    def slab_bytes(self) -> int:
        return self.slab.numel() * self.slab.element_size()

    def resident_lru_first(self, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` that are resident, from least to most recently used (the order they would be
        evicted in). The map keeps digests, not key strings, so the caller names the keys it asks about."""
        wanted = key_digests(keys)
        with self._lock:
            rows = self._index.find(wanted)
            order = {int(row): rank for rank, row in enumerate(self._index.lru_rows())}
        resident = [(order[int(row)], key) for key, row in zip(keys, rows) if int(row) in order]
        return [key for _, key in sorted(resident)]

    def get_many(self, keys: Sequence[str]) -> TierHits:
        wanted = key_digests(keys)
        with self._lock:
            hit, found = self._index.find_hits(wanted)
            if not len(hit):
                return TierHits.none(self.dim, self.dtype)
            self._index.touch(found)
            if self._host_rows is not None:
                vectors = torch.from_numpy(self._host_rows[found])
                if self._storage_dtype != self.dtype:  # bfloat16's int16 rows (a view costs a torch call: only then)
                    vectors = vectors.view(self.dtype)
            else:
                vectors = self.slab.index_select(0, torch.from_numpy(found).to(self.device))
        return TierHits(index=hit.tolist(), vectors=vectors)

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None:
        if self._closed:
            return  # a closed L1 keeps nothing (and its slab is gone)
        if vectors.shape != (len(keys), self.dim):
            raise InvalidInputError(f"expected vectors of shape ({len(keys)}, {self.dim}), got {tuple(vectors.shape)}")
        if len(keys) <= self.num_rows and len(set(keys)) == len(keys):
            batch_keys, source = keys, vectors  # every key once, all kept: the rows are already in order
        else:
            # Later duplicates win, and only the last num_rows keys can be resident after the batch anyway.
            last_position = {key: position for position, key in enumerate(keys)}
            batch = list(last_position.items())[-self.num_rows :]
            batch_keys = [key for key, _ in batch]
            source = vectors.index_select(0, torch.tensor([position for _, position in batch], device=vectors.device))
        source = source.to(device=self.device, dtype=self.dtype)
        wanted = key_digests(batch_keys)
        with self._lock:
            rows = self._index.find(wanted)
            new = np.flatnonzero(rows < 0)
            if len(new):
                # The batch's resident keys become the most recent first, so no eviction it causes takes one.
                self._index.touch(rows[rows >= 0])
                evicted_before = self._index.num_live + len(new) - self.num_rows
                rows[new] = self._index.insert(wanted[new])
                self.num_evicted += max(0, evicted_before)
            self._index.touch(rows)
            if self._host_rows is not None:
                self._host_rows[rows] = source.contiguous().view(self._storage_dtype).numpy()
            else:
                self.slab.index_copy_(0, torch.from_numpy(rows).to(self.device), source)

    def clear(self) -> None:
        with self._lock:
            self._index.clear()

    def close(self) -> None:
        """Drop the slab and the key map's arrays, not clear them: clearing writes every page of the map, faulting in
        those never used (at shutdown, fifteen small models' L1s took a service from 3.3 to 8.1 GB in 16 s and it
        was killed for memory, issue 38). A closed tier answers every key with a miss and stores nothing."""
        with self._lock:
            self._closed = True
            self._index = LruIndex(1)  # the arrays go with the old index; a one-row map finds nothing
            self._host_rows = None
            self.slab = torch.empty((0, self.dim), dtype=self.dtype, device=self.device)
