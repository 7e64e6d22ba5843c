"""The cache levels, fastest first: L1 memory (device slab), the host's disk (LMDB), L2 Redis, L3 Milvus. Each answers the
``ragcache.core.tier.Tier`` protocol; the walk over them is ``ragcache.core.levels``; compute is ``ragcache.models``."""

from ragcache.tiers.disk import DiskTier
from ragcache.tiers.memory import MemoryTier, resolve_device
from ragcache.tiers.milvus import MilvusTier
from ragcache.tiers.milvus_budget import L3Budget
from ragcache.tiers.redis import RedisTier
from ragcache.tiers.spaces import PerSpaceTier

__all__ = ["DiskTier", "MemoryTier", "RedisTier", "MilvusTier", "L3Budget", "PerSpaceTier", "resolve_device"]
