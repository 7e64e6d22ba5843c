"""What the service needs from a model's tokenizer: token counts and the length check (``TokenCounter``,
every served model has them, a remote one perhaps by estimate), and TEI's /tokenize and /decode
(``Tokenizer``: a local model). ``EmbeddingCache.tokenizer`` hands the service its model's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Token", "TokenCounter", "Tokenizer"]


@dataclass(frozen=True)
class Token:
    """One token of a text, as text-embeddings-inference's /tokenize reports it. ``start``/``stop`` are
    character offsets into the text (None for a special token, which is not in the text)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


@runtime_checkable
class TokenCounter(Protocol):
    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them before truncation (special tokens included)."""
        ...

    def check_lengths(self, texts: Sequence[str], field: str = "inputs") -> None:
        """Raise ``InvalidInputError`` naming the first text over the model's token limit."""
        ...


@runtime_checkable
class Tokenizer(TokenCounter, Protocol):

    def tokenize(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]: ...

    def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]: ...
