"""Who may warm what: one replica per (prefix, endpoint), and one warm budget for the whole fleet.

Every ragcache replica runs the keep-warm loop over the same registry. Without coordination N replicas send N
times the warms (and N times the budget). :class:`RedisWarmGate` keeps, in Redis, a lease per (prefix, endpoint)
that only its holder renews, and a sliding-minute log of the warms the whole fleet sent; a replica that dies stops
renewing, its leases expire after ``lease_ttl_s``, and another replica takes the work over at its next tick.
:class:`LocalWarmGate` is the single-process form (no Redis: every pair is this process's, the budget is local).

Within the fleet's budget each tenant has its own (``warm_budget_per_tenant_per_minute``, issue 27 item 8): a warm
spends from both or from neither, so one tenant's many prefixes use up its own share and never another tenant's.

When Redis fails, a replica warms with its local budget rather than not at all: a duplicate warm costs one
cached prefill, a missed one costs every user request a full prefill.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import redis

from ragcache.observe.logs import RepeatedWarnings
from ragcache.storage.redis_client import REDIS_ERRORS

from .policy import WarmBudget

__all__ = ["WarmGate", "TenantBudgets", "LocalWarmGate", "RedisWarmGate"]

log = logging.getLogger(__name__)
# A store or target that is down would otherwise be named once a tick (109 lines in 45 s): once, then once a minute.
log.addFilter(RepeatedWarnings())


class WarmGate(Protocol):
    """What the registry asks before each warm."""

    def holds(self, name: str, base_url: str) -> bool:
        """Whether this replica is the one that warms prefix ``name`` on ``base_url`` now (renewing its lease)."""
        ...

    def try_spend(self, tenant: str | None = None, reserve: int = 0, per_minute: int | None = None) -> bool:
        """Take one warm from the (fleet-wide) budget and from ``tenant``'s (the keys without a tenant share one);
        False, spending nothing, when this minute's budget of either is spent, or has no more than ``reserve`` warms
        left (kept for prefixes in use: an idle one's warm goes out only while the budget has room). ``per_minute``:
        the fleet's budget as sized now (:mod:`.budget`), within the configured one; None: the configured one."""
        ...


class TenantBudgets:
    """A :class:`WarmBudget` for the whole process and one per tenant, spent together (thread-safe)."""

    def __init__(self, per_minute: int, per_tenant_per_minute: int, clock: Callable[[], float]) -> None:
        self._total = WarmBudget(per_minute, clock)
        self._per_tenant_per_minute = per_tenant_per_minute
        self._clock = clock
        self._tenants: dict[str, WarmBudget] = {}  # bounded by the tenants of the API keys
        self._lock = threading.Lock()

    def try_spend(self, tenant: str | None, reserve: int = 0, per_minute: int | None = None) -> bool:
        with self._lock:
            own = self._tenants.get(tenant or "")
            if own is None:
                own = self._tenants[tenant or ""] = WarmBudget(self._per_tenant_per_minute, self._clock)
            # The sized budget lowers the fleet's: a warm out of it leaves (configured - sized) more in the log.
            lowered_by = 0 if per_minute is None else max(0, self._total.per_minute - per_minute)
            if own.num_available <= reserve or self._total.num_available <= reserve + lowered_by or \
                    not self._total.try_acquire():
                return False
            return own.try_acquire()


class LocalWarmGate:
    """One process: every (prefix, endpoint) is its own; the budgets are :class:`TenantBudgets`."""

    def __init__(self, budgets: TenantBudgets) -> None:
        self._budgets = budgets

    def holds(self, name: str, base_url: str) -> bool:
        return True

    def try_spend(self, tenant: str | None = None, reserve: int = 0, per_minute: int | None = None) -> bool:
        return self._budgets.try_spend(tenant, reserve, per_minute)


# Take the lease when free, renew it when ours; one script so that no other replica can slip in between.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

# Sliding logs of send times (Redis' own clock, so replicas' clocks never disagree): at most ARGV[1] warms in any
# ARGV[3] seconds fleet-wide (KEYS[1]) and ARGV[2] for the warm's tenant (KEYS[2]), each keeping its last ARGV[5]
# (for prefixes in use); both logs or neither take it.
_SPEND = """
local now = redis.call('TIME')
local now_s = tonumber(now[1]) + tonumber(now[2]) / 1e6
local window = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_s - window)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_s - window)
local reserve = tonumber(ARGV[5])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) - reserve or redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) - reserve then
  return 0
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now_s, ARGV[4])
  redis.call('PEXPIRE', key, math.ceil(window * 1000))
end
return 1
"""


class RedisWarmGate:
    """Leases and the budget in Redis, shared by every replica that uses the same ``key_prefix``.

    A held lease is renewed at most every ``lease_ttl_s / 3`` (remembered locally in between), so Redis sees a
    few commands per pair every TTL however fast the loop ticks.
    """

    def __init__(self, client: redis.Redis, *, budget_per_minute: int, budget_per_tenant_per_minute: int | None = None,
                 lease_ttl_s: float = 10.0, key_prefix: str = "rc:prefixes", replica_id: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._ttl_ms = max(1, int(lease_ttl_s * 1000))
        self._renew_every_s = lease_ttl_s / 3
        self._budget_per_minute = budget_per_minute
        self._budget_per_tenant = budget_per_tenant_per_minute or budget_per_minute
        self._key_prefix = key_prefix
        self.replica_id = replica_id or uuid.uuid4().hex
        self._clock = clock
        self._hold = client.register_script(_HOLD)
        self._spend = client.register_script(_SPEND)
        # (name, base_url) -> monotonic time until which our lease is surely still ours.
        self._held_until: dict[tuple[str, str], float] = {}
        self._fallback = TenantBudgets(budget_per_minute, self._budget_per_tenant, clock)
        self._sequence = itertools.count()

    def lease_key(self, name: str, base_url: str) -> str:
        return f"{self._key_prefix}:lease:{name}:{base_url}"

    def holds(self, name: str, base_url: str) -> bool:
        now = self._clock()
        if self._held_until.get((name, base_url), float("-inf")) - now > 2 * self._renew_every_s:
            return True
        try:
            held = bool(self._hold(keys=[self.lease_key(name, base_url)], args=[self.replica_id, self._ttl_ms]))
        except REDIS_ERRORS as exc:
            log.warning("prefix lease check failed (%s); warming from this replica", exc)
            return True
        if held:
            self._held_until[(name, base_url)] = now + self._ttl_ms / 1000
        else:
            self._held_until.pop((name, base_url), None)
        return held

    def log_keys(self, tenant: str | None) -> list[str]:
        """The fleet's log and ``tenant``'s, in one hash slot ({...}: a script's keys must share one on a Cluster)."""
        return [f"{{{self._key_prefix}:warm-log}}", f"{{{self._key_prefix}:warm-log}}:tenant:{tenant or ''}"]

    def try_spend(self, tenant: str | None = None, reserve: int = 0, per_minute: int | None = None) -> bool:
        member = f"{self.replica_id}:{next(self._sequence)}"
        budget = self._budget_per_minute if per_minute is None else min(per_minute, self._budget_per_minute)
        try:
            return bool(self._spend(keys=self.log_keys(tenant), args=[
                budget, self._budget_per_tenant, WarmBudget.window_s, member, reserve]))
        except REDIS_ERRORS as exc:
            log.warning("fleet warm budget unavailable (%s); using this replica's own", exc)
            return self._fallback.try_spend(tenant, reserve, per_minute)
