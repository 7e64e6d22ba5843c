"""The cache itself: the facade (``cache``), the level walk (``levels``), the tier protocol and its breaker
(``tier``, ``health``), batching of misses (``batching``), single flight (``flight``), write-behind (``writeback``),
keys, scopes and stats. It imports nothing above it: no concrete level, model, retrieval or service code.

The names other rooms and the service use are exported here, each imported on first use: the HTTP client reaches
this package (through ``health`` and ``keys``) and must not pull in torch, which ``cache`` and ``batching`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache.observe.exports import lazy_exports

_EXPORTS = {
    ".cache": ("EmbeddingCache",),
    ".result": ("EmbedResult", "Probe"),
    ".encoder": ("Capabilities", "Encoder", "EncoderStats", "capabilities_of"),
    ".batching": ("CALLER_GONE",),
    ".flight": ("RedisFlight",),
    ".tier": ("Tier", "TierHits"),
    ".health": ("TierHealth", "probe_levels"),
    ".keys": ("DTYPES", "EmbeddingSpace", "Generation", "key_digests", "text_hash", "text_hashes"),
    ".scope": ("TOKEN_IDS", "Prompt", "Scope", "UNSCOPED", "token_ids_of", "token_ids_text"),
    ".stats": ("CacheStats", "LatencyHistogram", "LevelStats"),
    ".tokens": ("Token", "Tokenizer"),
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ragcache.core.batching import CALLER_GONE
    from ragcache.core.cache import EmbeddingCache
    from ragcache.core.encoder import Capabilities, Encoder, EncoderStats, capabilities_of
    from ragcache.core.flight import RedisFlight
    from ragcache.core.health import TierHealth, probe_levels
    from ragcache.core.keys import DTYPES, EmbeddingSpace, Generation, key_digests, text_hash, text_hashes
    from ragcache.core.result import EmbedResult, Probe
    from ragcache.core.scope import TOKEN_IDS, UNSCOPED, Prompt, Scope, token_ids_of, token_ids_text
    from ragcache.core.stats import CacheStats, LatencyHistogram, LevelStats
    from ragcache.core.tier import Tier, TierHits
    from ragcache.core.tokens import Token, Tokenizer
