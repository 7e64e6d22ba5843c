"""Engine adapters: the protocols of the inference engines the prefix registry keeps warm, and nothing of its policy.

    target.py        Target (one deployment: base URL and served model) and PromptForm (completion or chat)
    vllm_client.py   VLLMClient: vLLM's HTTP API (one-token completions, /tokenize, /metrics) and LMCache's /pin
    vllm_events.py   KVEventSubscriber: vLLM's KV events applied to a BlockIndex (sync state, queue, breaker)
    vllm_stream.py   KVEventStream: its receiving half (ZMQ PUB + replay ROUTER: the sequence and its proof)
    vllm_wire.py     their wire format: EventsConfig, decode_batch (bounded in bytes), KVEventsError
    block_index.py   BlockIndex: which KV blocks one engine holds, by a digest of each block's tokens and all before it
    msgpack_lite.py  the bounded MessagePack reader the subscriber decodes with

A second engine that publishes KV events is a new file here, feeding the same ``BlockIndex``. Errors (all under
:class:`ragcache.errors.RagCacheError`):

    TargetUnavailableError  the engine (or an LMCache controller) was unreachable, timed out or answered an error
    TargetBadResponseError  ... answered what it never sends (malformed, a field missing, over the byte cap)
    KVEventsError           a publisher sent something that is not the engine's KV events
"""

from .block_index import AllBlocksCleared, BlockIndex, BlockRemoved, BlockStored, KVEvent, prefix_digests
from .msgpack_lite import MsgpackError, unpackb
from .target import PromptForm, Target
from .vllm_client import (
    CompletionUsage,
    PrefixCacheCounters,
    TargetBadResponseError,
    TargetUnavailableError,
    VLLMClient,
    parse_prefix_cache_counters,
)
from .vllm_events import KVEventSubscriber
from .vllm_wire import EventsConfig, KVEventsError, decode_batch

__all__ = [
    "AllBlocksCleared",
    "BlockIndex",
    "BlockRemoved",
    "BlockStored",
    "CompletionUsage",
    "EventsConfig",
    "KVEvent",
    "KVEventSubscriber",
    "KVEventsError",
    "MsgpackError",
    "PrefixCacheCounters",
    "PromptForm",
    "Target",
    "TargetBadResponseError",
    "TargetUnavailableError",
    "VLLMClient",
    "decode_batch",
    "parse_prefix_cache_counters",
    "prefix_digests",
    "unpackb",
]
