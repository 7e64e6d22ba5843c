"""L2: Redis, shared by every replica. Values are a small binary header followed by the raw vector.

The value layout is ``ragcache.tiers.codec``'s (the disk level stores the same bytes). A value whose header,
length or checksum does not match what this space expects (corrupt, truncated, written by another format
version or for another dtype/dim) is a miss: it is deleted, counted, and never returned.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis
import torch
from redis.cluster import RedisCluster

from ragcache.core.tier import TierHits
from ragcache.errors import TierUnavailableError
from ragcache.storage import cluster_pipeline
from ragcache.storage.redis_client import REDIS_ERRORS, is_cluster
from ragcache.tiers.codec import HEADER, as_le_bytes, decode_values, encode_value

__all__ = ["HEADER", "RedisTier", "encode_value", "decode_values"]

log = logging.getLogger(__name__)

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
        rows = as_le_bytes(vectors.to(self.dtype))
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

    def figures(self) -> dict[str, int]:
        """Values dropped as corrupt or foreign (``ragcache.core.tier.Figured``)."""
        return {"num_corrupt": self.num_corrupt}

    def close(self) -> None:
        """The client belongs to whoever opened it (the shared ``Stores``); nothing to release here."""
