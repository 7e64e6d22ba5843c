"""Single flight across processes: a text that several replicas miss at once is computed by one of them.

Before computing, a replica claims each missing key with a short lock in Redis
(``SET <key>:flight <token> NX PX <ttl_ms>``). The winner computes, stores the vector in the first shared level
(L2) *before* releasing, and releases with a compare-and-delete script (only its own token is deleted). A loser
polls that level for the vector; when the lock is gone and no vector came (the holder died or failed) or its
deadline passes, it computes the text itself. The lock saves work; it never fails or blocks a request longer
than ``wait_s``, and a Redis error makes every claim a win (compute here, as without the lock) until a
back-off has passed, so a Redis outage costs no extra time per request.

On one Redis server a batch's claims are one script call (a ``SET NX PX`` per key, run by the server) and so are
its releases (a compare-and-delete per key): a pipeline of a command per key cost the client more CPU than
the rest of a miss (packing and parsing 64 replies a 32-text request, ``ragcache bench overhead`` with
``--workers 2``). A cluster spreads keys over slots, and a script's keys must share one: there, single-key
commands (SET NX PX, EVAL with one key) in one non-transactional pipeline per node. Who is still holding a
lock (a loser's poll) is asked with EXISTS per key either way.

Within one process the in-process batcher already shares one computation per key, so keys this process holds
are claimed again without asking Redis (a reference count), and released in Redis when the last holder is done.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis
import torch

from ragcache.core.health import TierHealth
from ragcache.core.tier import TierHits
from ragcache.storage import cluster_pipeline
from ragcache.storage.redis_client import REDIS_ERRORS, is_cluster

__all__ = ["Flight", "RedisFlight", "wait_for_holders"]

log = logging.getLogger(__name__)

LOCK_SUFFIX = ":flight"
FIRST_POLL_S = 0.005
MAX_POLL_S = 0.05

# Deletes the lock only when it still holds our token: after a TTL expiry another replica may own it.
_COMPARE_AND_DELETE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""
# One server: KEYS the locks; ARGV[1] our token, ARGV[2] the TTL in ms. Per key 1 when won, else 0.
_CLAIM_MANY = """
local won = {}
for i, key in ipairs(KEYS) do
    if redis.call('set', key, ARGV[1], 'NX', 'PX', ARGV[2]) then won[i] = 1 else won[i] = 0 end
end
return won
"""
# One server: _COMPARE_AND_DELETE for every key of KEYS; how many were ours.
_RELEASE_MANY = """
local released = 0
for _, key in ipairs(KEYS) do
    if redis.call('get', key) == ARGV[1] then released = released + redis.call('del', key) end
end
return released
"""


class Flight(Protocol):
    """What the cache needs to compute a key once across processes (``RedisFlight`` is the real one)."""

    def claim(self, keys: Sequence[str]) -> list[bool]:
        """Per key: True when this process should compute it (and must ``release`` it afterwards)."""
        ...

    def wait(self, keys: Sequence[str], fetch: Callable[[Sequence[str]], TierHits]) -> dict[int, torch.Tensor]:
        """Wait for other processes to publish ``keys`` (looked up through ``fetch``); position -> vector."""
        ...

    def release(self, keys: Sequence[str]) -> None:
        """Give up claims returned True by ``claim``, once their vectors are published."""
        ...


def wait_for_holders(
    keys: Sequence[str],
    fetch: Callable[[Sequence[str]], TierHits],
    is_held: Callable[[Sequence[str]], list[bool]],
    *,
    wait_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, torch.Tensor]:
    """Poll ``fetch`` for ``keys`` until each is found, its lock is gone, or ``wait_s`` has passed.

    Returns the vectors found, by position in ``keys``; the caller computes the rest. Lock state is read
    *before* each fetch: a holder publishes before it releases, so a key unlocked before a fetch that still
    misses it will not arrive (its holder died or failed), and waiting on is pointless.
    """
    deadline = clock() + wait_s
    found: dict[int, torch.Tensor] = {}
    pending = list(range(len(keys)))
    delay_s = FIRST_POLL_S
    while pending:
        held = is_held([keys[i] for i in pending])
        hits = fetch([keys[i] for i in pending])
        hit_positions = set(hits.index)
        for offset, vector in zip(hits.index, hits.vectors):
            found[pending[offset]] = vector
        pending = [i for offset, (i, alive) in enumerate(zip(pending, held)) if alive and offset not in hit_positions]
        remaining_s = deadline - clock()
        if not pending or remaining_s <= 0:
            break
        sleep(min(delay_s, remaining_s))
        delay_s = min(delay_s * 2, MAX_POLL_S)
    return found


class RedisFlight:
    """Per-key locks in Redis (or Redis Cluster) with a token unique to this object.

    ``ttl_ms`` bounds how long a dead holder keeps others waiting; ``wait_s`` bounds how long a loser waits
    for the holder's vector before computing it itself.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        ttl_ms: int,
        wait_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.client = client
        self.ttl_ms = ttl_ms
        self.wait_s = wait_s
        self.token = uuid.uuid4().hex
        self._clock = clock
        self._sleep = sleep
        self._num_holders: dict[str, int] = {}  # key -> requests of this process holding its claim
        self._lock = threading.Lock()
        self._health = TierHealth(clock=clock)
        self._claim_many = self._release_many = None
        if not is_cluster(client):
            self._claim_many = client.register_script(_CLAIM_MANY)
            self._release_many = client.register_script(_RELEASE_MANY)

    def claim(self, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            won = [key in self._num_holders for key in keys]
            ask = [i for i, key in enumerate(keys) if not won[i]]
            if ask:
                locks = [_lock_key(keys[i]) for i in ask]
                if self._claim_many is not None:
                    claim_many = self._claim_many
                    answers = self._guarded(lambda: claim_many(keys=locks, args=[self.token, self.ttl_ms]))
                else:
                    answers = self._guarded(lambda: cluster_pipeline.execute_any(
                        self.client, [("SET", lock, self.token, "NX", "PX", self.ttl_ms) for lock in locks]))
                for i, answer in zip(ask, answers if answers is not None else [True] * len(ask)):
                    won[i] = bool(answer)
            for key, is_won in zip(keys, won):
                if is_won:
                    self._num_holders[key] = self._num_holders.get(key, 0) + 1
        return won

    def wait(self, keys: Sequence[str], fetch: Callable[[Sequence[str]], TierHits]) -> dict[int, torch.Tensor]:
        return wait_for_holders(keys, fetch, self.is_held, wait_s=self.wait_s, clock=self._clock, sleep=self._sleep)

    def is_held(self, keys: Sequence[str]) -> list[bool]:
        """Per key: whether some process holds its lock (False when Redis cannot say)."""
        answers = self._guarded(lambda: cluster_pipeline.execute_any(self.client, [("EXISTS", _lock_key(key)) for key in keys]))
        return [bool(answer) for answer in answers] if answers is not None else [False] * len(keys)

    def release(self, keys: Sequence[str]) -> None:
        with self._lock:
            done = []
            for key in keys:
                left = self._num_holders.get(key, 0) - 1
                if left > 0:
                    self._num_holders[key] = left
                elif self._num_holders.pop(key, None) is not None:
                    done.append(key)
        if done:
            # A failed release leaves the lock to its TTL: others wait at most that long, then compute.
            locks = [_lock_key(key) for key in done]
            if self._release_many is not None:
                release_many = self._release_many
                self._guarded(lambda: release_many(keys=locks, args=[self.token]))
            else:
                self._guarded(lambda: cluster_pipeline.execute_any(
                    self.client, [("EVAL", _COMPARE_AND_DELETE, 1, lock, self.token) for lock in locks]))

    def _guarded(self, call: Callable[[], Any]) -> Any:
        """``call()`` (one script call, or one pipeline of single-key commands); None when Redis failed or is backed
        off from."""
        if not self._health.should_try():
            return None
        try:
            # Not redis-py's ClusterPipeline on a cluster: with a primary hung, it resent that node's commands one
            # by one, each waiting out its timeout (21 s for one claim of 60 keys); execute_any costs one timeout a batch.
            answers = call()
        except (*REDIS_ERRORS, OSError) as exc:
            if self._health.record_failure(exc):
                log.warning("single flight off while Redis fails (every replica computes its own misses): %s", exc)
            return None
        if self._health.record_success():
            log.warning("single flight is back")
        return answers


def _lock_key(key: str) -> str:
    return key + LOCK_SUFFIX

