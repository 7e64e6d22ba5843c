"""What the engines' own KV events say about each prefix: its resident blocks per endpoint (a
:class:`ragcache.engines.BlockIndex`, fed by one :class:`ragcache.engines.KVEventSubscriber` per endpoint that
publishes), and which endpoints saw blocks removed since the keep-warm loop last looked (it warms what was evicted,
instead of on a timer).

A prefix's blocks are placed by its token ids, which vLLM's ``/tokenize`` gives; they are asked for once per version
and endpoint by the keep-warm loop (never by a stats or route request), so an endpoint reports a prefix's residency
from the tick after its first warm on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from ragcache.engines import EventsConfig, KVEventSubscriber, Target, TargetUnavailableError, VLLMClient, prefix_digests
from ragcache.errors import ConfigError

from .model import Prefix

__all__ = ["EngineView", "ResidencyView"]


@dataclass(frozen=True)
class ResidencyView:
    """One prefix on one endpoint, by the engine's events. ``events``: ``synced`` (the counts are exact), ``syncing``
    (connected again; the stream is being proved or the index rebuilt: counts unknown, never resident), ``out_of_sync``
    (events were lost, the publisher is down or misbehaves: counts unknown), ``off`` (the endpoint publishes none)."""

    events: str
    resident_blocks: int | None = None
    num_blocks: int | None = None

    @property
    def fully_resident(self) -> bool:
        return self.num_blocks is not None and self.num_blocks > 0 and self.resident_blocks == self.num_blocks

    @property
    def evicted(self) -> bool:
        return self.num_blocks is not None and self.num_blocks > 0 and (self.resident_blocks or 0) < self.num_blocks


class EngineView:
    """The subscribers of the endpoints that publish KV events, and the prefixes' token ids (thread-safe)."""

    def __init__(self, events: Mapping[str, EventsConfig], vllm: VLLMClient) -> None:
        self._vllm = vllm
        if events:
            try:
                import zmq  # noqa: F401 - pyzmq: the subscribers' transport, needed only where an endpoint publishes
            except ImportError:
                raise ConfigError("RAGCACHE_PREFIX_KV_EVENTS needs pyzmq (pip install pyzmq)") from None
        # The subscribers keep real time (socket deadlines, their breakers' back-off), whatever clock the registry has.
        self._subscribers = {url: KVEventSubscriber(url, config, on_change=self._changed) for url, config in events.items()}
        self._lock = threading.Lock()
        self._tokens: dict[tuple[str, int, str], tuple[int, ...]] = {}  # (prefix, version, url) -> the head's token ids
        # (prefix, version, url) -> (block size, the head's block digests): hashing a 1,400-token head costs ~90 us,
        # and a route reads every registered prefix on every endpoint.
        self._digests: dict[tuple[str, int, str], tuple[int, list[bytes]]] = {}
        self._changed_urls: set[str] = set()

    def start(self) -> None:
        for subscriber in self._subscribers.values():
            subscriber.start()

    def stop(self) -> None:
        for subscriber in self._subscribers.values():
            subscriber.stop()

    def publishes(self, url: str) -> bool:
        return url in self._subscribers

    def subscriber(self, url: str) -> KVEventSubscriber | None:
        return self._subscribers.get(url)

    def _changed(self, url: str) -> None:
        with self._lock:
            self._changed_urls.add(url)

    def take_changed(self) -> set[str]:
        """The endpoints whose blocks were removed or cleared since the last call."""
        with self._lock:
            changed, self._changed_urls = self._changed_urls, set()
            return changed

    def needs_tokens(self, prefix: Prefix, url: str) -> bool:
        with self._lock:
            return self.publishes(url) and (prefix.name, prefix.version, url) not in self._tokens

    def learn_tokens(self, prefix: Prefix, url: str, head: str) -> None:
        """Ask ``url``'s ``/tokenize`` for the head's token ids (what the engine's blocks are keyed by); a failure
        leaves them unknown until the next tick."""
        try:
            tokens = self._vllm.tokenize(Target(url, prefix.target.model), head)
        except TargetUnavailableError:
            return
        with self._lock:
            stale = [key for key in self._tokens if key[0] == prefix.name and key[2] == url]
            for key in stale:
                del self._tokens[key]
                self._digests.pop(key, None)
            self._tokens[(prefix.name, prefix.version, url)] = tuple(tokens)

    def forget(self, name: str) -> None:
        with self._lock:
            self._tokens = {key: tokens for key, tokens in self._tokens.items() if key[0] != name}
            self._digests = {key: digests for key, digests in self._digests.items() if key[0] != name}

    def view(self, prefix: Prefix, url: str) -> ResidencyView:
        """The prefix's residency on ``url`` as the engine's events say."""
        subscriber = self._subscribers.get(url)
        if subscriber is None:
            return ResidencyView("off")
        state = subscriber.state
        if state != "synced":
            return ResidencyView(state)
        key = (prefix.name, prefix.version, url)
        block_size = subscriber.index.block_size
        with self._lock:
            tokens = self._tokens.get(key)
            known = self._digests.get(key)
        if tokens is None or block_size is None:
            return ResidencyView("synced")
        if known is None or known[0] != block_size:
            known = (block_size, prefix_digests(tokens, block_size))
            with self._lock:
                if self._tokens.get(key) is tokens:  # not forgotten nor learned again meanwhile
                    self._digests[key] = known
        digests = known[1]
        return ResidencyView("synced", subscriber.index.resident_blocks(digests), len(digests))
