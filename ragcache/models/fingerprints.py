"""Where a model's fingerprint lives: the canary vectors and the generation they belong to, kept with the space.

One record per base space (the space at generation 0, so the id never moves): in Redis (L2) a hash
``rc:fp:<space_id>`` without expiry, in Milvus (L3) a collection ``rc_fp_<space_id>`` with one row per canary.
Redis is the arbiter between replicas: a new generation is written with compare-and-set (a Lua script), so
two replicas that notice a change at once agree on one generation, and two replicas running different models
never share one. Milvus is the durable copy (Redis may be flushed): loading takes the higher generation of
the two. With neither level, the record lives in this process only (drift is still noticed while it runs).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from pymilvus import DataType

from ragcache.errors import TierUnavailableError
from ragcache.storage.milvus_errors import milvus_failures
from ragcache.storage.redis_client import REDIS_ERRORS

__all__ = ["Fingerprint", "FingerprintStore", "MemoryFingerprints", "RedisFingerprints", "MilvusFingerprints", "Fingerprints"]

log = logging.getLogger(__name__)

REDIS_KEY_PREFIX = "rc:fp:"
MILVUS_PREFIX = "rc_fp_"
# Writes the record only when the stored generation is still the one the caller read ('' = no record yet):
# KEYS[1] the record; ARGV: expected generation, new generation, dim, float32 canary bytes.
_CAS_SCRIPT = """
local current = redis.call('HGET', KEYS[1], 'generation')
if (current == false and ARGV[1] == '') or current == ARGV[1] then
  redis.call('HSET', KEYS[1], 'generation', ARGV[2], 'dim', ARGV[3], 'vectors', ARGV[4])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class Fingerprint:
    """The canary vectors of one generation of a space, as float32 ``[num_canaries, dim]``."""

    generation: int
    vectors: np.ndarray


class FingerprintStore(Protocol):
    name: str

    def load(self, space_id: str) -> Fingerprint | None: ...

    def save(self, space_id: str, fingerprint: Fingerprint, *, expected: int | None) -> bool:
        """Store ``fingerprint``; False when the stored generation is no longer ``expected`` (None: no record)."""
        ...


class MemoryFingerprints:
    """In this process only: for a cache with neither L2 nor L3."""

    name = "memory"

    def __init__(self) -> None:
        self._records: dict[str, Fingerprint] = {}
        self._lock = threading.Lock()

    def load(self, space_id: str) -> Fingerprint | None:
        return self._records.get(space_id)

    def save(self, space_id: str, fingerprint: Fingerprint, *, expected: int | None) -> bool:
        with self._lock:
            current = self._records.get(space_id)
            if (None if current is None else current.generation) != expected:
                return False
            self._records[space_id] = fingerprint
            return True


class RedisFingerprints:
    """The record as a Redis hash (generation, dim, raw little-endian float32 canaries), no TTL."""

    name = "L2"

    def __init__(self, client) -> None:
        self.client = client

    def load(self, space_id: str) -> Fingerprint | None:
        try:
            record = self.client.hgetall(REDIS_KEY_PREFIX + space_id)
        except REDIS_ERRORS as exc:
            raise TierUnavailableError(self.name, f"cannot read the fingerprint: {exc}") from exc
        return _decode(record)

    def save(self, space_id: str, fingerprint: Fingerprint, *, expected: int | None) -> bool:
        vectors = np.ascontiguousarray(fingerprint.vectors, dtype="<f4")
        args = ("" if expected is None else str(expected), str(fingerprint.generation), str(vectors.shape[1]), vectors.tobytes())
        try:
            return bool(self.client.eval(_CAS_SCRIPT, 1, REDIS_KEY_PREFIX + space_id, *args))
        except REDIS_ERRORS as exc:
            raise TierUnavailableError(self.name, f"cannot write the fingerprint: {exc}") from exc


def _decode(record: dict) -> Fingerprint | None:
    """A stored hash as a fingerprint; None when absent or damaged (then it is written again)."""
    try:
        generation, dim = int(record[b"generation"]), int(record[b"dim"])
        vectors = np.frombuffer(record[b"vectors"], dtype="<f4")
        if generation < 0 or dim <= 0 or vectors.size % dim or not np.isfinite(vectors).all():
            return None
    except (KeyError, ValueError):
        return None
    return Fingerprint(generation, vectors.reshape(-1, dim).astype(np.float32))


class MilvusFingerprints:
    """The record as a Milvus collection: one row per canary (its index, the generation, the vector)."""

    name = "L3"

    def __init__(self, client) -> None:
        self.client = client

    def load(self, space_id: str) -> Fingerprint | None:
        collection = MILVUS_PREFIX + space_id
        try:
            if not self.client.has_collection(collection):
                return None
            self.client.load_collection(collection)
            rows = self.client.query(collection, filter="canary >= 0", output_fields=["canary", "generation", "vector"])
        except milvus_failures as exc:
            raise TierUnavailableError(self.name, f"cannot read the fingerprint: {exc}") from exc
        rows = sorted(rows, key=lambda row: row["canary"])
        if not rows or len({row["generation"] for row in rows}) != 1 or [row["canary"] for row in rows] != list(range(len(rows))):
            return None  # empty, or half written by a write that failed: written again by the next check
        vectors = np.stack([np.asarray(row["vector"], dtype=np.float32) for row in rows])
        return Fingerprint(int(rows[0]["generation"]), vectors) if np.isfinite(vectors).all() else None

    def save(self, space_id: str, fingerprint: Fingerprint, *, expected: int | None) -> bool:
        """An upsert, not a compare-and-set (Milvus has none): Redis arbitrates when there is one."""
        collection = MILVUS_PREFIX + space_id
        rows = [
            {"canary": index, "generation": fingerprint.generation, "vector": vector}
            for index, vector in enumerate(fingerprint.vectors.astype(np.float32))
        ]
        try:
            if not self.client.has_collection(collection):
                self._create(collection, fingerprint.vectors.shape[1])
            self.client.upsert(collection, rows)
        except milvus_failures as exc:
            raise TierUnavailableError(self.name, f"cannot write the fingerprint: {exc}") from exc
        return True

    def _create(self, collection: str, dim: int) -> None:
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("canary", DataType.INT64, is_primary=True)
        schema.add_field("generation", DataType.INT64)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        index_params = self.client.prepare_index_params()
        index_params.add_index(field_name="vector", index_type="FLAT", metric_type="IP")
        self.client.create_collection(collection, schema=schema, index_params=index_params)
        self.client.load_collection(collection)


class Fingerprints:
    """Every store of one process, used as one: the newest record wins; the first store arbitrates writes.

    A store that fails is skipped (logged): the check then works from the others, and fails only when none
    answers, rather than blocking a start or a switch on one level being down.
    """

    def __init__(self, stores: Sequence[FingerprintStore]):
        self.stores = list(stores) or [MemoryFingerprints()]

    @classmethod
    def of(cls, redis_client=None, milvus_client=None) -> Fingerprints:
        stores: list[FingerprintStore] = []
        if redis_client is not None:
            stores.append(RedisFingerprints(redis_client))
        if milvus_client is not None:
            stores.append(MilvusFingerprints(milvus_client))
        return cls(stores)

    def load(self, space_id: str) -> tuple[Fingerprint | None, int | None]:
        """The newest record, and the generation the arbiter (first store) holds (None: no record there)."""
        records: list[Fingerprint] = []
        arbiter: int | None = None
        failures = 0
        for position, store in enumerate(self.stores):
            try:
                record = store.load(space_id)
            except TierUnavailableError as exc:
                failures += 1
                log.warning("drift check: %s", exc)
                continue
            if record is not None:
                records.append(record)
                if position == 0:
                    arbiter = record.generation
        if failures == len(self.stores):
            raise TierUnavailableError("fingerprints", "no level could be read")
        return (max(records, key=lambda r: r.generation) if records else None), arbiter

    def save(self, space_id: str, fingerprint: Fingerprint, *, expected: int | None) -> bool:
        """Compare-and-set on the arbiter (skipped when it is down), then a copy to every other store."""
        first, *others = self.stores
        try:
            if not first.save(space_id, fingerprint, expected=expected):
                return False
        except TierUnavailableError as exc:
            if not others:
                raise
            log.warning("drift check: %s; writing the others only", exc)
        for store in others:
            try:
                store.save(space_id, fingerprint, expected=None)
            except TierUnavailableError as exc:
                log.warning("drift check: %s", exc)
        return True
