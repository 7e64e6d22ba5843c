"""A real Redis (L2) that stops answering (SIGSTOP: connections accepted, nothing answered): every L2 miss while it is
down is counted as ``unavailable``, once per key, whether the walk waited for its deadline or the open breaker
skipped it (ragcache.core.causes; the other causes: tests/core/test_miss_causes.py)."""

from __future__ import annotations

import os
import signal

import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache.storage.redis_client import open_redis
from ragcache.tiers import MemoryTier, RedisTier
from tests.fakes import HashEncoder

DIM = 8


def causes(cache: EmbeddingCache) -> dict[str, dict[str, int]]:
    """Per level, only the causes that counted anything."""
    return {level.level: {cause: n for cause, n in level.misses_by_cause.items() if n} for level in cache.stats().levels}


def test_l2_misses_while_a_paused_redis_is_down_are_unavailable_once_each(caplog):
    server = EmbeddedRedis()  # this test's own: it is the one paused
    client = open_redis(server.url, timeout_s=0.2)  # a paused Redis costs one 0.2 s deadline, then the breaker opens
    paused = False
    try:
        l1 = MemoryTier(100 * DIM * 4, DIM, torch.float32)
        levels = Levels([l1, RedisTier(client, dim=DIM, dtype=torch.float32)], dim=DIM, dtype=torch.float32, write_behind=False)
        with EmbeddingCache(HashEncoder(DIM), levels) as cache:
            cache.embed(["a", "b"])  # written to L2 while it answers
            l1.clear()
            os.kill(server.process.pid, signal.SIGSTOP)
            paused = True
            # a and b are in L2, c never was: while L2 is down all three are its misses, and all unavailable.
            assert cache.embed_detailed(["a", "b", "c"]).served == {"L1": 0, "L2": 0, "compute": 3}
            state = cache.level_states()["L2"]
            assert state["up"] is False and state["num_outages"] == 1
            # Skipped by the open breaker, or let through as a probe that fails: unavailable either way.
            assert cache.embed_detailed(["d"]).served["compute"] == 1
            assert cache.level_states()["L2"]["num_outages"] == 1
            assert causes(cache) == {"L1": {"never_seen": 4, "evicted": 2}, "L2": {"never_seen": 2, "unavailable": 4}}
            assert cache.stats().levels[1].errors == 4
            assert sum("L2 is down" in record.message for record in caplog.records) == 1
    finally:
        if paused:
            os.kill(server.process.pid, signal.SIGCONT)
        client.close()
        server.stop()
