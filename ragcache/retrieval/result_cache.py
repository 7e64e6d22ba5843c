"""Search results cached in Redis, keyed by collection version + query key + search parameters.

Every ingest or delete bumps the collection's version (``INCR``), so a cached result list is only ever
found by searches of the collection exactly as it was when the list was computed; old versions are
never read again and expire by TTL. Redis being down skips the cache, never fails a search.

Two details keep stale results out:
- a version key that does not exist yet starts at a random 63-bit number (``SET NX``), so a version key
  lost to a Redis eviction or restart never restarts at a number whose old results may still be stored;
- a bump that fails (Redis down) raises ``TierUnavailableError``: other replicas read the same Redis, and
  only a bump that landed there stops them serving the collection as it was (the knowledge base bumps
  before and after every write and answers 503 when it cannot). The collection is also left *pending*: this
  process reads and writes no cached results for it until a later bump succeeds.
Collections are named by their uid (random per creation), so a dropped and re-created collection of the
same name shares nothing with its predecessor.

Values are capped (``max_value_bytes``, 1 MiB by default): a result list of top_k=1000 documents of 64 KB
text each is ~65 MB of JSON, which would cost Redis memory and every hit a long decode. A larger list is
simply not cached (counted in ``num_too_large``); a value above ``DECODE_OFF_LOOP_BYTES`` found by ``aget`` is
decoded in a worker thread, off the event loop.

Every command names one key, so on a Redis Cluster the version key and the result keys may (and do) live
in different slots on different nodes; nothing needs a hash tag.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from typing import Any

import orjson
import redis
import redis.asyncio
from redis.cluster import RedisCluster

from ragcache.core.health import TierHealth
from ragcache.core.keys import identity_hash
from ragcache.errors import TierUnavailableError
from ragcache.storage.redis_client import REDIS_ERRORS, asyncio_twin

__all__ = ["ResultCache"]

log = logging.getLogger(__name__)

KEY_PREFIX = "rc:kb"
TIER = "result cache"
DEFAULT_MAX_VALUE_BYTES = 1024 * 1024
# Above this, a value is decoded off the event loop: orjson decodes ~1 GB/s here, so 64 KiB is ~0.1 ms,
# while a thread hop costs ~0.1 ms too.
DECODE_OFF_LOOP_BYTES = 64 * 1024


class ResultCache:
    """Cached search results (plain JSON-able values) of knowledge-base collections."""

    def __init__(self, client: redis.Redis | RedisCluster, *, ttl_s: int = 300, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES):
        self.client = client
        self.ttl_s = ttl_s
        self.max_value_bytes = max_value_bytes
        self.num_too_large = 0  # result lists not cached because their JSON was over max_value_bytes
        self._health = TierHealth()
        self._pending: set[str] = set()  # collection uids whose last bump failed
        self._lock = threading.Lock()
        self._async_client: redis.asyncio.Redis | redis.asyncio.RedisCluster | None = None

    def get(self, collection_uid: str, query_key: str, params: str) -> tuple[Any | None, int | None]:
        """(cached value or None, the version it was looked up at or None when the cache is unusable).

        Pass the version on to ``put``: a result computed after this lookup belongs to that version, even
        if an ingest bumps the collection meanwhile (it is then stored where no one will look again).
        """
        if not self._usable(collection_uid):
            return None, None
        try:
            version = self._version(collection_uid)
            raw = self.client.get(self._result_key(collection_uid, version, query_key, params))
        except (*REDIS_ERRORS, ValueError) as exc:
            self._failed(exc)
            return None, None
        self._succeeded()
        if raw is None:
            return None, version
        try:
            return orjson.loads(raw), version
        except orjson.JSONDecodeError:
            return None, version

    async def aget(self, collection_uid: str, query_key: str, params: str) -> Any | None:
        """The cached value, looked up without blocking the event loop (an asyncio client on the same
        server); None when there is none, or whenever the answer would need a blocking step (the collection
        has no version yet, or owes a bump): the caller then takes the ordinary path, which handles those.
        """
        if not self._health.should_try() or collection_uid in self._pending:
            return None
        if self._async_client is None:
            self._async_client = asyncio_twin(self.client)
        try:
            version = await self._async_client.get(self._version_key(collection_uid))
            if version is None:
                return None
            raw = await self._async_client.get(self._result_key(collection_uid, int(version), query_key, params))
        except (*REDIS_ERRORS, ValueError, OSError) as exc:
            self._failed(exc)
            return None
        self._succeeded()
        if raw is None or len(raw) > self.max_value_bytes:
            return None  # over the cap: written before the cap was lowered, or by another writer
        try:
            if len(raw) > DECODE_OFF_LOOP_BYTES:
                return await asyncio.to_thread(orjson.loads, raw)
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None

    def put(self, collection_uid: str, version: int, query_key: str, params: str, value: Any) -> None:
        """Store ``value`` (JSON-able) under the version ``get`` returned."""
        if not self._usable(collection_uid):
            return
        encoded = orjson.dumps(value)
        if len(encoded) > self.max_value_bytes:
            self.num_too_large += 1
            return
        try:
            key = self._result_key(collection_uid, version, query_key, params)
            self.client.set(key, encoded, ex=self.ttl_s)
        except REDIS_ERRORS as exc:
            self._failed(exc)
        else:
            self._succeeded()

    def bump(self, collection_uid: str) -> None:
        """Invalidate every cached result of the collection (call after its contents changed).

        Raises ``TierUnavailableError`` when Redis did not confirm it: the replicas sharing this Redis would
        keep serving the old results until their TTL, so the caller must not report the change as done.
        """
        failure = self._try_bump(collection_uid)
        if failure is not None:
            raise TierUnavailableError(TIER, f"Redis did not take the invalidation: {failure}") from failure

    def _try_bump(self, collection_uid: str) -> Exception | None:
        try:
            self._version(collection_uid)  # make sure a missing key starts at a random number, not at 0
            self.client.incr(self._version_key(collection_uid))
        except (*REDIS_ERRORS, ValueError) as exc:
            with self._lock:
                self._pending.add(collection_uid)
            self._failed(exc)
            return exc
        with self._lock:
            self._pending.discard(collection_uid)
        self._succeeded()
        return None

    def discard(self, collection_uid: str) -> None:
        """Forget a dropped collection's version (its uid is never used again; results expire by TTL)."""
        try:
            self.client.delete(self._version_key(collection_uid))
        except REDIS_ERRORS as exc:
            self._failed(exc)
        with self._lock:
            self._pending.discard(collection_uid)

    # ---- internals ---------------------------------------------------------------------------------------

    def _usable(self, collection_uid: str) -> bool:
        if not self._health.should_try():
            return False
        if collection_uid in self._pending:
            # A bump this process owes failed: it must succeed before any cached result is trusted again.
            return self._try_bump(collection_uid) is None
        return True

    def _version(self, collection_uid: str) -> int:
        key = self._version_key(collection_uid)
        version = self.client.get(key)
        if version is None:
            self.client.set(key, secrets.randbits(63) - (1 << 62), nx=True)
            version = self.client.get(key)
        return int(version)  # type: ignore[arg-type]

    @staticmethod
    def _version_key(collection_uid: str) -> str:
        return f"{KEY_PREFIX}:version:{collection_uid}"

    @staticmethod
    def _result_key(collection_uid: str, version: int, query_key: str, params: str) -> str:
        digest = identity_hash(f"{query_key}\x00{params}".encode())
        return f"{KEY_PREFIX}:result:{collection_uid}:{version}:{digest}"

    def _failed(self, exc: Exception) -> None:
        if self._health.record_failure(exc):
            log.warning("search result cache: Redis is down, searching without it: %s", exc)

    def _succeeded(self) -> None:
        if self._health.record_success():
            log.warning("search result cache: Redis is back")
