"""Token counts for OpenAI's ``usage``, remembered per text so a repeated text is tokenized once."""

from __future__ import annotations

import threading
from collections import OrderedDict

from fastapi import Request

from ragcache.core import EmbeddingCache


def _memo_key(text: str) -> tuple[int, int]:
    """A text's key in the memo: Python's own string hash (SipHash under a secret drawn per process, so no caller can
    aim a collision at it; cached on the string) and the length. BLAKE2b, as the cache keys use, cost a tenth of
    an L1 hit here, for counts that only fill in ``usage``."""
    return hash(text), len(text)


class TokenCounts:
    """Token counts of recently seen texts, keyed by ``_memo_key`` (not the texts: those can be large).
    OpenAI's ``usage`` needs them, and tokenizing 32 paragraphs costs ~2.5 ms, more than everything else an
    L1 hit costs; a repeated text is counted once."""

    def __init__(self, count_tokens, max_entries: int = 100_000):
        self._count_tokens = count_tokens
        self._counts: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._max_entries = max_entries
        self._lock = threading.Lock()

    def known_total(self, texts: list[str]) -> int | None:
        """The total when every text has been counted before, else None; never tokenizes, so the event loop may
        call it (a repeated request then needs no worker thread at all)."""
        with self._lock:  # _memo_key, inline and in C (map, zip): this runs for every L1 hit
            counts = list(map(self._counts.get, zip(map(hash, texts), map(len, texts))))
        return None if None in counts else sum(counts)  # type: ignore[arg-type]

    def total(self, texts: list[str]) -> int:
        hashes = [_memo_key(text) for text in texts]
        with self._lock:
            known = {h: self._counts[h] for h in hashes if h in self._counts}
        missing = {h: text for h, text in zip(hashes, texts) if h not in known}
        if missing:
            counted = dict(zip(missing, self._count_tokens(list(missing.values()))))
            known.update(counted)
            with self._lock:
                self._counts.update(counted)
                while len(self._counts) > self._max_entries:
                    self._counts.popitem(last=False)  # oldest first: a plain FIFO is enough for a memo
        return sum(known[h] for h in hashes)


def token_counts_of(request: Request, cache: EmbeddingCache) -> TokenCounts:
    """The token-count memo of ``cache``'s space (made on first use, on the event loop: no race)."""
    counters = getattr(request.app.state, "token_counts", None)
    if counters is None:
        counters = request.app.state.token_counts = {}
    if cache.space.space_id not in counters:
        counters[cache.space.space_id] = TokenCounts(cache.tokenizer.count_tokens)
    return counters[cache.space.space_id]
