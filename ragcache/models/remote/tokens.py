"""Counting tokens for a remote model: its tokenizer when one is available locally, else an estimate.

Counts size upstream requests (``max_tokens`` per request, ``max_input_tokens`` per text) and feed the
"tokens sent" and "tokens saved" figures. With no local tokenizer the count is **UTF-8 bytes / 2, rounded
up, plus 2** (for the special tokens a model adds). BPE and WordPiece vocabularies average 3-5 bytes a
token on English and about 3 bytes (one CJK character) a token on Chinese or Japanese, so the estimate
over-counts those, and requests are smaller than they could be rather than too large. Text that is
nearly all rare symbols or emoji can reach one token per byte and be under-counted; an upstream that then
refuses the request (400 or 413) gets it again in halves (``ComputeBatcher`` splits per-text failures).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from ragcache.core.keys import text_hashes

__all__ = ["TokenCounter", "estimate_tokens"]

log = logging.getLogger(__name__)

SPECIAL_TOKENS = 2  # e.g. [CLS] and [SEP], <s> and </s>


def estimate_tokens(text: str) -> int:
    """The documented conservative estimate: ceil(UTF-8 bytes / 2) + 2 (``UnicodeEncodeError`` for a text
    that is not valid Unicode, as the tokenizer refuses it)."""
    return (len(text.encode("utf-8")) + 1) // 2 + SPECIAL_TOKENS


class TokenCounter:
    """Tokens per text with ``tokenizer`` (a local folder or a name in the local Hugging Face cache) or,
    when that is None or cannot be loaded offline, with ``estimate_tokens``. The tokenizer loads on first
    use (importing transformers takes seconds), once."""

    def __init__(self, tokenizer: str | None, *, model_name: str = ""):
        self._source = tokenizer
        self._model_name = model_name
        self._tokenizer: Any = None  # a transformers tokenizer, once loaded
        self._loaded = tokenizer is None
        self._lock = threading.Lock()

    @property
    def method(self) -> str:
        """"tokenizer" or "estimate": how the counts so far were made (the tokenizer loads on first count)."""
        return "tokenizer" if self._tokenizer is not None else "estimate"

    def count(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text; ``InvalidTextError`` naming the first text that is not valid Unicode."""
        if not texts:
            return []  # a tokenizer fails on an empty batch (IndexError)
        tokenizer = self._load()
        try:
            if tokenizer is None:
                return [estimate_tokens(text) for text in texts]
            encoded = tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
        except (TypeError, UnicodeEncodeError):
            # A lone surrogate: the tokenizer refuses it without saying which text; text_hashes names it.
            text_hashes(texts)
            raise
        return [len(ids) for ids in encoded]

    def _load(self):
        if self._loaded:
            return self._tokenizer
        with self._lock:
            if not self._loaded:
                try:
                    from transformers import AutoTokenizer

                    self._tokenizer = AutoTokenizer.from_pretrained(self._source, local_files_only=True)
                except Exception as exc:  # noqa: BLE001 - any failure to load means: estimate instead
                    log.warning("model %r: tokenizer %r not available offline (%s); estimating tokens as UTF-8 bytes / 2 + 2",
                                self._model_name, self._source, type(exc).__name__)
                self._loaded = True
        return self._tokenizer
