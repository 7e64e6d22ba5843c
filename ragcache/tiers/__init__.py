"""The cache levels, fastest first: L1 memory (device slab), L2 Redis, L3 Milvus; compute is the last step."""

from ragcache.tiers.base import Tier, TierHealth, TierHits
from ragcache.tiers.memory import MemoryTier
from ragcache.tiers.milvus import MilvusTier
from ragcache.tiers.redis import RedisTier

__all__ = ["Tier", "TierHits", "TierHealth", "MemoryTier", "RedisTier", "MilvusTier"]
