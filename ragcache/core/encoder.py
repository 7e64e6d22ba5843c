"""The model seam: the one ``Encoder`` protocol every part of the library takes a model through, its stats, and the
one place that says what a model can do beyond encoding (``Capabilities``).

A local model (``ragcache.models.ModelEncoder``), a remote one (``ragcache.models.remote.RemoteEncoder``) and a test's
fake all fit ``Encoder``; what differs between them is declared in their ``capabilities``, read through
``capabilities_of`` (a fake that declares none can do nothing beyond encoding), never asked with ``getattr`` where it
is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from ragcache.core.keys import EmbeddingSpace

__all__ = ["Capabilities", "Encoder", "EncoderStats", "NO_CAPABILITIES", "capabilities_of"]


@dataclass(frozen=True)
class EncoderStats:
    """What a model did: the texts and batches it computed and the time it took."""

    num_texts: int
    num_batches: int
    compute_s: float
    batch_sizes: tuple[int, ...]  # the most recent batch sizes the model saw

    @property
    def seconds_per_text(self) -> float:
        return self.compute_s / self.num_texts if self.num_texts else 0.0


@dataclass(frozen=True)
class Capabilities:
    """What a model can do beyond ``encode(texts)``."""

    max_batch: int | None = None  # most texts the cache's batcher hands it at once; None: RAGCACHE_COMPUTE_BATCH_SIZE
    takes_prompt: bool = False  # encode(texts, prompt=text) applies a named prompt itself (else the text is prefixed)
    prompts: Mapping[str, str] = field(default_factory=dict)  # its own named prompts (sentence-transformers' config)
    counts_tokens: bool = False  # count_tokens / check_lengths (``ragcache.core.tokens.TokenCounter``)
    tokenizes: bool = False  # tokenize / decode with its own vocabulary (``ragcache.core.tokens.Tokenizer``)
    passes_caller_key: bool = False  # caller_key(texts, api_key): a caller's provider key for its misses
    takes_token_ids: bool = False  # encode() reads texts under ``scope.TOKEN_IDS`` as token ids, sent as they are
    remote: bool = False  # computed by a remote API: what a hit saves is upstream tokens, billed to a key


NO_CAPABILITIES = Capabilities()


class Encoder(Protocol):
    """What the cache, the drift check and the service need from a model."""

    space: EmbeddingSpace

    def encode(self, texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:
        """Vectors for ``texts``; ``prompt`` (a named prompt's text) is given only to a model whose capabilities
        say ``takes_prompt``: any other gets each text with the prompt put before it instead."""
        ...

    def stats(self) -> EncoderStats: ...


def capabilities_of(encoder: object) -> Capabilities:
    """``encoder.capabilities``, or ``NO_CAPABILITIES`` for one that declares none (a test's fake encoder)."""
    capabilities = getattr(encoder, "capabilities", None)
    return capabilities if isinstance(capabilities, Capabilities) else NO_CAPABILITIES
