"""L3: Milvus, durable and large. One collection per embedding space; primary key = the text hash.

A Milvus Lite file by default (a uri ending in ``.db``), a Milvus server when the uri is ``http://...``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from pymilvus import DataType, MilvusClient

from ragcache.core.tier import TierHits
from ragcache.errors import TierUnavailableError
from ragcache.storage.milvus_errors import milvus_error_message, milvus_failures
from ragcache.tiers.milvus_budget import WRITTEN_AT, BudgetKeeper, L3Budget

__all__ = ["MilvusTier"]

TEXT_HASH_LENGTH = 32
MAX_ROWS_PER_CALL = 2000

log = logging.getLogger(__name__)

class MilvusTier:
    """Vectors of one space in the Milvus collection ``rc_<space_id>``, created and loaded on first use.

    Milvus stores FLOAT_VECTOR (float32): float16 and bfloat16 vectors widen to float32 exactly and narrow
    back without loss, so every dtype round-trips bit for bit.
    """

    name = "L3"

    def __init__(
        self,
        client: MilvusClient,
        *,
        space_id: str,
        dim: int,
        dtype: torch.dtype,
        budget: L3Budget | None = None,
        clock: Callable[[], float] = time.time,
        empty_recheck_s: float | None = None,
    ):
        self.client = client
        self.collection = f"rc_{space_id}"
        self.dim = dim
        self.dtype = dtype
        self.budget = BudgetKeeper(client, self.collection, budget or L3Budget(), clock=clock)
        self._has_written_at = True  # False for a collection made before rows recorded their write time
        self._ready = False
        self.num_corrupt = 0
        self._ready_lock = threading.Lock()
        self._num_failed_prepares = 0  # failed tries to prepare the collection, and why the last one failed
        self._last_failure: str | None = None
        # An empty collection is not asked (``may_hold``): its row count is read again every empty_recheck_s
        # (None: always asked), so rows another process writes are found within that time.
        self._empty_recheck_s = empty_recheck_s
        self._holds_rows = empty_recheck_s is None
        self._next_count_at = 0.0

    def _ensure_collection(self) -> None:
        if self._ready:
            return
        num_failed = self._num_failed_prepares
        with self._ready_lock:
            if self._ready:
                return
            if self._num_failed_prepares != num_failed:
                # Another thread failed to prepare while this one waited for the lock: trying again at once
                # would make every waiting caller pay one more deadline in turn (a hung Milvus at start-up).
                raise TierUnavailableError(self.name, self._last_failure or "Milvus failed")
            try:
                self._prepare_collection()
            except milvus_failures as exc:
                self._note_failed_prepare(f"Milvus failed: {milvus_error_message(exc)}")
                raise
            except TierUnavailableError as exc:  # a server client that cannot connect (stores.MilvusConnection)
                self._note_failed_prepare(str(exc))
                raise

    def _note_failed_prepare(self, message: str) -> None:
        self._last_failure = message
        self._num_failed_prepares += 1

    def _prepare_collection(self) -> None:
        """Create the collection when missing (or holding other vectors), and load it."""
        self._has_written_at = True
        if self.client.has_collection(self.collection):
            fields = self._stored_fields()
            if fields.get("vector") != self.dim:
                self._replace_foreign_collection()
            elif WRITTEN_AT not in fields:
                self._has_written_at = False
                if self.budget.budget.enabled:
                    log.warning("L3 collection %s predates write times: its age/size budget is not applied "
                                "(drop the collection, a cache, to start one that has them)", self.collection)
        if not self.client.has_collection(self.collection):
            schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=TEXT_HASH_LENGTH)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=self.dim)
            schema.add_field(WRITTEN_AT, DataType.INT64)  # for the optional budget (milvus_budget.py)
            index_params = MilvusClient.prepare_index_params()
            # Lookups here are by primary key only; FLAT costs nothing to build and lets the collection load.
            index_params.add_index(field_name="vector", index_type="FLAT", metric_type="IP")
            self.client.create_collection(self.collection, schema=schema, index_params=index_params)
        self.client.load_collection(self.collection)
        self._ready = True

    def _failed(self, exc: BaseException) -> TierUnavailableError:
        # A restarted Milvus has the collection unloaded: the next call creates/loads it again.
        self._ready = False
        return TierUnavailableError(self.name, f"Milvus failed: {milvus_error_message(exc)}")

    def _stored_fields(self) -> dict[str, int | None]:
        """The stored collection's field names, with the vector field's dimension (others: None)."""
        described = self.client.describe_collection(self.collection)
        return {
            field.get("name"): int(field.get("params", {}).get("dim", 0)) if field.get("name") == "vector" else None
            for field in described.get("fields", [])
        }

    def _replace_foreign_collection(self) -> None:
        # The space id names the dimension, so a collection of this name holding other vectors was written
        # by something else (or damaged): none of its rows can be served. It is cache data, derived from
        # texts, so it is dropped and rebuilt rather than left to make every lookup fail.
        log.warning("L3: collection %s does not hold %d-d vectors; dropping it and starting it again", self.collection, self.dim)
        self.num_corrupt += int(self.client.get_collection_stats(self.collection).get("row_count", 0))
        self.client.drop_collection(self.collection)

    def figures(self) -> dict[str, int]:
        """Rows dropped as corrupt or foreign (``ragcache.core.tier.Figured``)."""
        return {"num_corrupt": self.num_corrupt}

    @staticmethod
    def _text_hashes(keys: Sequence[str]) -> list[str]:
        # Keys are rc:<space_id>:<text_hash>; the collection already names the space.
        return [key[-TEXT_HASH_LENGTH:] for key in keys]

    def may_hold(self, keys: Sequence[str] = ()) -> bool:
        """False while the collection is known to be empty: a lookup there costs a Milvus call (the client's CPU
        and Milvus Lite's) to find nothing, on every request with a miss. Once it holds a row, always True.

        ``keys``: the walk's (the ``Tier`` protocol's ``may_hold(keys)``), not looked at: the collection is one
        space's, so its being empty answers for any keys; ``PerSpaceTier`` asks without them."""
        if self._holds_rows:
            return True
        now = time.monotonic()
        if now < self._next_count_at:
            return False
        self._next_count_at = now + (self._empty_recheck_s or 0.0)
        try:
            self._holds_rows = self.count() > 0
        except TierUnavailableError:
            return True  # asked, so that the failure is seen and counted where lookups are
        return self._holds_rows

    def get_many(self, keys: Sequence[str]) -> TierHits:
        if not keys:
            return TierHits.none(self.dim, self.dtype)
        hashes = self._text_hashes(keys)
        try:
            self._ensure_collection()
            rows = self.client.get(self.collection, ids=hashes, output_fields=["vector"])
        except milvus_failures as exc:
            raise self._failed(exc) from exc
        if not rows:
            return TierHits.none(self.dim, self.dtype)
        hash_to_position = {text_hash: position for position, text_hash in enumerate(hashes)}
        # Milvus answers in its own order; the contract is ascending positions.
        rows = sorted(rows, key=lambda row: hash_to_position[row["key"]])
        # Each row converted once: the check and the answer share the array.
        arrays = [_as_vector_of(row["vector"], self.dim) for row in rows]
        corrupt = [row["key"] for row, array in zip(rows, arrays) if array is None]
        if corrupt:
            self._drop_corrupt(corrupt)
        good = [(hash_to_position[row["key"]], array) for row, array in zip(rows, arrays) if array is not None]
        if not good:
            return TierHits.none(self.dim, self.dtype)
        index = [position for position, _ in good]
        vectors = torch.from_numpy(np.stack([array for _, array in good]))
        return TierHits(index=index, vectors=vectors.to(self.dtype))

    def _drop_corrupt(self, text_hashes: list[str]) -> None:
        """Delete rows that are not vectors of this space (wrong length, NaN/inf): counted, never served; the
        cache computes them again and writes the good vectors back."""
        self.num_corrupt += len(text_hashes)
        log.warning("L3: %d row(s) of the wrong dimension or not finite deleted, e.g. %s", len(text_hashes), text_hashes[0])
        try:
            self.client.delete(self.collection, ids=text_hashes)
        except milvus_failures as exc:
            raise self._failed(exc) from exc

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None:
        if not keys:
            return
        rows = vectors.detach().to(device="cpu", dtype=torch.float32).numpy()
        try:
            self._ensure_collection()
            data = [{"key": text_hash, "vector": row} for text_hash, row in zip(self._text_hashes(keys), rows)]
            if self._has_written_at:
                written_at = self.budget.now_ms()
                for row in data:
                    row[WRITTEN_AT] = written_at
            # Milvus Lite 2.5 takes one call of 5,000+ rows ~30x slower per row than calls of 2,000
            # (measured: ~150 vs ~4,700 rows/s), so a large batch (an ingest, a warm-up) goes in chunks.
            for start in range(0, len(data), MAX_ROWS_PER_CALL):
                self.client.upsert(self.collection, data[start : start + MAX_ROWS_PER_CALL])
            self._holds_rows = True
            if self._has_written_at:
                self.budget.maybe_enforce()
        except milvus_failures as exc:
            raise self._failed(exc) from exc

    def count(self) -> int:
        """Number of vectors stored (Milvus' own row count)."""
        try:
            self._ensure_collection()
            return int(self.client.get_collection_stats(self.collection).get("row_count", 0))
        except milvus_failures as exc:
            raise self._failed(exc) from exc

    def close(self) -> None:
        """The client belongs to the shared ``Stores``; nothing to release here."""


def _as_vector_of(vector, dim: int) -> np.ndarray | None:
    """``vector`` as float32 when it is a finite vector of ``dim`` numbers, else None."""
    try:
        array = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError):
        return None
    return array if array.shape == (dim,) and np.isfinite(array).all() else None
