"""L2: Redis, shared by every replica. Values are a small binary header followed by the raw vector.

Value layout (little-endian), 16 bytes of header then ``dim * itemsize`` bytes of vector:

    magic b"RC" | format version u8 | dtype code u8 | dim u32 | xxh3-64 of the vector bytes u64 | vector

A value whose header, length or checksum does not match what this space expects (corrupt, truncated, written
by another format version or for another dtype/dim) is a miss: it is deleted, counted, and never returned.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence

import numpy as np
import redis
import torch
import xxhash
from redis.cluster import RedisCluster

from ragcache.core.tier import TierHits
from ragcache.errors import TierUnavailableError
from ragcache.storage import cluster_pipeline
from ragcache.storage.redis_client import REDIS_ERRORS, is_cluster

__all__ = ["RedisTier", "encode_value", "decode_values"]

log = logging.getLogger(__name__)

MAGIC = b"RC"
FORMAT_VERSION = 1
HEADER = struct.Struct("<2sBBIQ")
DTYPE_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
# numpy has no bfloat16: its bytes travel as int16 and are reinterpreted by torch.
NUMPY_STORAGE = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}


def encode_value(vector_bytes: bytes, dtype: torch.dtype, dim: int) -> bytes:
    """One stored value: header + raw little-endian vector bytes."""
    checksum = xxhash.xxh3_64_intdigest(vector_bytes)
    return HEADER.pack(MAGIC, FORMAT_VERSION, DTYPE_CODES[dtype], dim, checksum) + vector_bytes


def _as_le_bytes(vectors: torch.Tensor) -> np.ndarray:
    """Rows of raw little-endian bytes, one row per vector (this machine is little-endian, as is x86/ARM)."""
    storage = vectors.detach().cpu().contiguous()
    if storage.dtype == torch.bfloat16:
        storage = storage.view(torch.int16)
    array = storage.numpy()
    return array.view(np.uint8).reshape(len(array), -1)


def decode_values(values: Sequence[bytes | None], dtype: torch.dtype, dim: int) -> tuple[list[int], torch.Tensor, list[int]]:
    """Validate and decode a batch of stored values.

    Returns (positions of valid values, their vectors stacked, positions of corrupt values). ``None``
    values (absent keys) are in neither list. The header checks run on the whole batch at once (one join,
    numpy comparisons); only the checksum is computed value by value.
    """
    row_bytes = dim * torch.empty((), dtype=dtype).element_size()
    expected_len = HEADER.size + row_bytes
    if None not in values and set(map(len, values)) == {expected_len}:  # type: ignore[arg-type]
        # The common case, judged in C: every key present and every value the right size.
        sized, corrupt = list(range(len(values))), []
        joined = b"".join(values)  # type: ignore[arg-type]
    else:
        present = [position for position, value in enumerate(values) if value is not None]
        sized = [position for position in present if len(values[position]) == expected_len]  # type: ignore[arg-type]
        corrupt = [position for position in present if len(values[position]) != expected_len]  # type: ignore[arg-type]
        if not sized:
            return [], torch.empty((0, dim), dtype=dtype), corrupt
        joined = b"".join([values[position] for position in sized])  # type: ignore[misc]
    table = np.frombuffer(joined, dtype=np.uint8).reshape(len(sized), expected_len)
    expected_head = np.frombuffer(HEADER.pack(MAGIC, FORMAT_VERSION, DTYPE_CODES[dtype], dim, 0)[:8], dtype=np.uint8)
    head_ok = (table[:, :8] == expected_head).all(axis=1)
    stored_checksums = table[:, 8:16].copy().view("<u8").ravel()
    view, checksum_of = memoryview(joined), xxhash.xxh3_64_intdigest
    computed = np.fromiter(
        (checksum_of(view[start + HEADER.size : start + expected_len]) for start in range(0, len(joined), expected_len)),
        dtype=np.uint64,
        count=len(sized),
    )
    ok = head_ok & (stored_checksums == computed)
    valid = sized
    if not ok.all():
        valid = [position for position, good in zip(sized, ok) if good]
        corrupt = sorted(corrupt + [position for position, good in zip(sized, ok) if not good])
        table = table[ok]
    raw = table[:, HEADER.size :].copy().view(NUMPY_STORAGE[dtype])  # copy: contiguous and writable
    vectors = torch.from_numpy(raw)
    if dtype == torch.bfloat16:
        vectors = vectors.view(torch.bfloat16)
    return valid, vectors, corrupt


# KEYS: the keys; ARGV[1]: TTL in seconds (0: none); ARGV[i + 1]: the value of KEYS[i].
_SET_MANY = """
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
    if ttl > 0 then
        redis.call('SET', key, ARGV[i + 1], 'EX', ttl)
    else
        redis.call('SET', key, ARGV[i + 1])
    end
end
return #KEYS
"""


class RedisTier:
    """Vectors of one embedding space in Redis, with a TTL per entry.

    ``get_many`` is one round trip per chunk of ``chunk_size`` keys (MGET, or a pipeline of GETEX when the
    TTL is refreshed on hit); ``put_many`` is one script call per chunk (a SET ... EX per key, run by the server). With a Redis Cluster
    client it is one round trip per node per chunk: keys hash to slots all over the cluster, so one MGET
    would fail with CROSSSLOT; one MGET (and one SET) per key go in one pipeline per node, every
    node's written before any is read (``ragcache.storage.cluster_pipeline``: a failing node costs one timeout).
    """

    name = "L2"
    shared = True  # every process of a fleet sees it (single flight publishes here: ragcache.core.levels)

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        dim: int,
        dtype: torch.dtype,
        ttl_s: int | None = 7 * 24 * 3600,
        refresh_ttl_on_hit: bool = False,
        chunk_size: int = 1000,
    ):
        self.client = client
        self.dim = dim
        self.dtype = dtype
        self.ttl_s = ttl_s
        self.refresh_ttl_on_hit = refresh_ttl_on_hit and ttl_s is not None
        self.chunk_size = chunk_size
        self.num_corrupt = 0
        self._is_cluster = is_cluster(client)
        # On one server a chunk is stored by one command: a pipeline of a SET per key cost the client more CPU
        # packing and parsing than anything else on the miss path (``ragcache bench overhead``). A cluster
        # spreads keys over slots, and a script's keys must share one: there, one SET per key, per node.
        self._set_many = None if self._is_cluster else client.register_script(_SET_MANY)

    def get_many(self, keys: Sequence[str]) -> TierHits:
        try:
            values: list[bytes | None] = []
            for start in range(0, len(keys), self.chunk_size):
                values.extend(self._fetch(keys[start : start + self.chunk_size]))
            valid, vectors, corrupt = decode_values(values, self.dtype, self.dim)
            if corrupt:
                self._drop_corrupt([keys[position] for position in corrupt])
        except REDIS_ERRORS as exc:
            raise TierUnavailableError(self.name, f"Redis failed: {exc}") from exc
        return TierHits(index=valid, vectors=vectors)

    def _fetch(self, keys: Sequence[str]) -> list[bytes | None]:
        if self.refresh_ttl_on_hit:
            return cluster_pipeline.execute_any(self.client, [("GETEX", key, "EX", self.ttl_s) for key in keys])
        if not self._is_cluster:
            return self.client.mget(keys)  # type: ignore[return-value]
        # One MGET per key (an MGET across slots fails with CROSSSLOT; MGET, not GET, so that a key holding
        # another type reads as absent, as it does in one MGET), in one pipeline per node.
        return [reply[0] for reply in cluster_pipeline.execute(self.client, [("MGET", key) for key in keys])]  # type: ignore[arg-type]

    def _drop_corrupt(self, keys: list[str]) -> None:
        self.num_corrupt += len(keys)
        log.warning("L2: %d corrupt or foreign value(s) deleted, e.g. %s", len(keys), keys[0])
        # One DEL per key: a multi-key DEL would fail across Redis Cluster slots.
        cluster_pipeline.execute_any(self.client, [("DEL", key) for key in keys])

    def put_many(self, keys: Sequence[str], vectors: torch.Tensor) -> None:
        rows = _as_le_bytes(vectors.to(self.dtype))
        try:
            for start in range(0, len(keys), self.chunk_size):
                chunk_keys = keys[start : start + self.chunk_size]
                values = [encode_value(row.tobytes(), self.dtype, self.dim) for row in rows[start : start + self.chunk_size]]
                if self._set_many is not None:
                    self._set_many(keys=chunk_keys, args=[self.ttl_s or 0, *values])
                else:
                    expiry = ("EX", self.ttl_s) if self.ttl_s is not None else ()
                    cluster_pipeline.execute_any(self.client, [("SET", key, value, *expiry) for key, value in zip(chunk_keys, values)])
        except REDIS_ERRORS as exc:
            raise TierUnavailableError(self.name, f"Redis failed: {exc}") from exc

    def close(self) -> None:
        """The client belongs to whoever opened it (the shared ``Stores``); nothing to release here."""
