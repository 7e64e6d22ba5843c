"""What the engines' own KV events say about each prefix: its resident blocks per endpoint (a
:class:`ragcache.engines.BlockIndex`, fed by one :class:`ragcache.engines.KVEventSubscriber` per endpoint that
publishes), and which endpoints saw blocks removed since the keep-warm loop last looked (it warms what was evicted,
instead of on a timer).

A prefix's blocks are placed by its token ids, which vLLM's ``/tokenize`` gives; they are asked for once per version
and endpoint by the keep-warm loop (never by a stats or route request), so an endpoint reports a prefix's residency
from the tick after its first warm on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ragcache.engines import EventsConfig, KVEventSubscriber, PromptForm, Target, TargetUnavailableError, VLLMClient, prefix_digests

from .config import PrefixRegistryConfig
from .model import Prefix
from .stats import EventsStats
from .text import template_head
from .trust import EventsTrust, claim_checked

__all__ = ["Claim", "EngineView", "ResidencyView", "common_prefix", "engine_tokens"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """What the events said of a prefix when a warm went out: its view, the digests of the blocks they claimed held,
    and the index's removal count then (an eviction that raced the warm makes the check say nothing)."""

    view: ResidencyView
    digests: tuple[bytes, ...] = ()
    mark: int = 0


@dataclass(frozen=True)
class ResidencyView:
    """One prefix on one endpoint, by the engine's events. ``events``: ``synced`` (the counts are exact), ``syncing``
    (connected again; the stream is being proved or the index rebuilt: counts unknown, never resident), ``out_of_sync``
    (events were lost, the publisher is down or misbehaves: counts unknown), ``untrusted`` (its events claimed blocks
    that warms did not find: ignored for a while, :mod:`.trust`), ``off`` (the endpoint publishes none)."""

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
    """The subscribers of the endpoints that publish KV events, the prefixes' token ids, and whether each endpoint's
    events are believed (:mod:`.trust`) (thread-safe)."""

    def __init__(self, events: Mapping[str, EventsConfig], vllm: VLLMClient,
                 registry_config: PrefixRegistryConfig | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._vllm = vllm
        self._config = registry_config or PrefixRegistryConfig()
        self._clock = clock
        for url, given in events.items():
            if not given.endpoint.startswith("ipc://"):
                log.warning("KV events of %s come from %s: whoever binds that address is believed (until warms find "
                            "otherwise); an ipc:// path in a folder only vLLM's user writes is one nobody else can bind "
                            "(docs/kv-events.md)", url, given.endpoint)
        # The subscribers keep real time (socket deadlines, their breakers' back-off), whatever clock the registry has.
        self._subscribers = {url: KVEventSubscriber(url, config, on_change=self._changed) for url, config in events.items()}
        # The first check falls due verify_interval_s after the start, as every later one after the last warm.
        self._trust = {url: EventsTrust(last_checked_at=clock()) for url in events}
        self._lock = threading.Lock()
        self._tokens: dict[tuple[str, int, str], tuple[int, ...]] = {}  # (prefix, version, url) -> the head's token ids
        # (prefix, version, url) -> (block size, the head's block digests): hashing a 1,400-token head costs ~90 us,
        # and a route reads every registered prefix on every endpoint.
        self._digests: dict[tuple[str, int, str], tuple[int, list[bytes]]] = {}
        self._changed_urls: set[str] = set()
        self._listener: Callable[[str], None] | None = None

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

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(url)`` (from a subscriber thread) whenever ``url``'s events remove or clear blocks."""
        self._listener = listener

    def _changed(self, url: str) -> None:
        with self._lock:
            self._changed_urls.add(url)
        if self._listener is not None:
            self._listener(url)

    def take_changed(self, url: str) -> bool:
        """Whether ``url``'s events removed or cleared blocks since the last call for it."""
        with self._lock:
            changed = url in self._changed_urls
            self._changed_urls.discard(url)
            return changed

    def state(self, url: str) -> str:
        """``url``'s events: ``synced``, ``syncing``, ``out_of_sync``, ``untrusted`` (:mod:`.trust`) or ``off``."""
        subscriber = self._subscribers.get(url)
        if subscriber is None:
            return "off"
        with self._lock:
            if not self._trust[url].trusted(self._clock()):
                return "untrusted"
        return subscriber.state

    def held_blocks(self, url: str) -> int | None:
        """Every block ``url`` holds by its events; None unless they are synced and believed."""
        subscriber = self._subscribers.get(url)
        return subscriber.index.num_blocks if subscriber is not None and self.state(url) == "synced" else None

    def needs_tokens(self, prefix: Prefix, url: str) -> bool:
        with self._lock:
            return self.publishes(url) and (prefix.name, prefix.version, url) not in self._tokens

    def learn_tokens(self, prefix: Prefix, url: str) -> None:
        """Ask ``url``'s ``/tokenize`` for the token ids every request on ``prefix`` starts with (what the engine's
        blocks are keyed by); a failure leaves them unknown until the next pass."""
        try:
            tokens = engine_tokens(self._vllm, Target(url, prefix.target.model), prefix)
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
        """The prefix's residency on ``url`` as the engine's events say (counts only while synced and believed)."""
        subscriber = self._subscribers.get(url)
        if subscriber is None:
            return ResidencyView("off")
        state = self.state(url)
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

    # ----- trust (:mod:`.trust`) ----------------------------------------------------------------------------------

    def check_due(self, url: str) -> bool:
        """Whether a warm should go out on ``url`` to check its events (none was sent there for ``verify_interval_s``);
        taking it counts as the check's start, so one goes out per interval however many prefixes are due."""
        if url not in self._trust:
            return False
        now = self._clock()
        with self._lock:
            trust = self._trust[url]
            if now - trust.last_checked_at < self._config.verify_interval_s:
                return False
            trust.last_checked_at = now
            return True

    def claim(self, prefix: Prefix, url: str) -> Claim:
        """What the events say of ``prefix`` on ``url`` now, to check against a warm's answer (:meth:`check`)."""
        view = self.view(prefix, url)
        subscriber = self._subscribers.get(url)
        if subscriber is None or not view.resident_blocks:
            return Claim(view)
        with self._lock:
            known = self._digests.get((prefix.name, prefix.version, url))
        digests = tuple(known[1][:view.resident_blocks]) if known is not None else ()
        return Claim(view, digests, subscriber.index.num_removed)

    def check(self, url: str, claim: Claim, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        """Record what a warm on ``url`` found against what the events claimed before it went out. A warm that found
        less while the events removed one of the claimed blocks meanwhile (an eviction raced it) says nothing."""
        claimed = claim.view
        subscriber = self._subscribers.get(url)
        block_size = subscriber.index.block_size if subscriber is not None else None
        if subscriber is None or claimed.events != "synced" or claimed.resident_blocks is None or not block_size or \
                num_prompt_tokens < 1:
            return
        agrees = claim_checked(claimed.resident_blocks, num_prompt_tokens, num_cached_tokens, block_size)
        if not agrees and subscriber.index.removed_since(claim.digests, claim.mark):
            return
        with self._lock:
            self._trust[url].record(agrees, self._clock(), self._config.untrust_after, self._config.untrusted_s, url)

    def stats(self) -> tuple[EventsStats, ...]:
        """Each publishing endpoint's feed: its state, whether its events are believed, the checks and what they found."""
        out = []
        for url, subscriber in sorted(self._subscribers.items()):
            state = self.state(url)
            with self._lock:
                trust = self._trust[url]
                out.append(EventsStats(url, state, state != "untrusted", trust.num_checks, trust.num_disagreements,
                                       subscriber.num_new_streams))
        return tuple(out)


# What a chat's next turn starts with, in the probe that finds where requests on a chat prefix stop sharing tokens.
_PROBE = "x"


def engine_tokens(vllm: VLLMClient, target: Target, prefix: Prefix) -> list[int]:
    """The token ids every request on ``prefix`` starts with, as the engine sees them (issue 42, item 1).

    A completion prompt starts with the head as vLLM tokenizes it. A chat request starts with the model's chat template
    around the system message, which only the engine knows: vLLM's ``/tokenize`` with ``messages`` applies it. The
    tokens shared by every request are those the warm's chat (the system message alone) has in common with one that
    goes on differently (a user turn after it; for a template, the system message itself going on).
    """
    head = template_head(prefix.text, prefix.is_template)
    if prefix.form is not PromptForm.CHAT:
        return vllm.tokenize(target, head)
    warm = vllm.tokenize_messages(target, [{"role": "system", "content": head}])
    other = [{"role": "system", "content": head + _PROBE}] if prefix.is_template else \
        [{"role": "system", "content": head}, {"role": "user", "content": _PROBE}]
    return common_prefix(warm, vllm.tokenize_messages(target, other))


def common_prefix(a: list[int], b: list[int]) -> list[int]:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]
