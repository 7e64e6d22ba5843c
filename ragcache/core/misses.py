"""What no level holds, computed: once per key in this process (the batcher) and, with a ``Flight``, once per key
across the processes of a fleet.

The resolver is given what it needs (the cache's ``Levels``, the model's encoder, the flight, the counter of
calls in progress) and calls only down into them: computed vectors are written up into the levels here, and a
vector another replica published is taken from the shared level (L2). The facade hands it the positions the walk
left missing and gets back how many of them were computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ragcache.core.batching import CallsInProgress, ComputeBatcher
from ragcache.core.encoder import Encoder, capabilities_of
from ragcache.core.flight import Flight
from ragcache.core.keys import KeyList
from ragcache.core.levels import Levels
from ragcache.errors import ConfigError
from ragcache.observe.tracing import span

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["ComputeConfig", "MissResolver"]


@dataclass(frozen=True)
class ComputeConfig:
    """How misses go to the model (``ComputeBatcher``): at most ``max_batch`` texts a call, a call waits up to
    ``max_wait_s`` for company while another request is on its way, and at most ``max_pending`` texts wait
    (more: ``OverloadedError``)."""

    max_batch: int = 64
    max_wait_s: float = 0.002
    max_pending: int = 4096


class MissResolver:
    """Computes a request's missing keys into its vectors, through one ``ComputeBatcher`` (``batcher``)."""

    def __init__(
        self,
        encoder: Encoder,
        levels: Levels,
        calls: CallsInProgress,
        *,
        flight: Flight | None = None,
        device: torch.device,
        dtype: torch.dtype,
        compute: ComputeConfig = ComputeConfig(),
        tracer: Tracer | None = None,
    ):
        self._shared = levels.shared
        if flight is not None and self._shared is None:
            raise ConfigError("single flight across processes needs a shared level (L2) after L1 to publish vectors in")
        self.levels = levels
        self._encoder = encoder
        # Whether the model takes a named prompt apart (``encode(texts, prompt=...)``): a class attribute, read once.
        self._takes_prompt = capabilities_of(encoder).takes_prompt
        self.batcher = ComputeBatcher(self._encode, max_batch=compute.max_batch, max_wait_s=compute.max_wait_s,
                                      max_pending=compute.max_pending, levels=levels, calls=calls)
        self._flight = flight
        self._device, self._dtype = device, dtype
        self._tracer = tracer  # None: no spans, no tracing work (ragcache.observe.tracing)

    def resolve(self, vectors: torch.Tensor, served: np.ndarray, missing: np.ndarray, keys: KeyList, texts: list[str],
                *, prompt: str | None = None) -> int:
        """Compute the keys at positions ``missing`` of ``keys`` (texts ``texts``, under ``prompt``) into
        ``vectors`` and mark in ``served`` the level that answered each instead, if one did; returns how many
        were computed here."""
        if self._flight is None:
            return self._compute(vectors, served, missing, keys, texts, prompt=prompt)
        return self._compute_once_across_processes(self._flight, vectors, served, missing, keys, texts, prompt)

    def model_inputs(self, texts: Sequence[str], prompt: str | None) -> list[str]:
        """``texts`` as the model's ``encode`` is given them under a named prompt's text: as they are for a model
        that takes the prompt apart (``takes_prompt``), else with the prompt put before each."""
        if prompt is None or self._takes_prompt:
            return list(texts)
        return [prompt + text for text in texts]

    def _encode(self, texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:
        """The model's vectors for ``texts`` under a named prompt's text. A local model applies it as
        ``SentenceTransformer.encode(texts, prompt=text)`` does (models whose pooling leaves the prompt's tokens
        out need that); any other (a remote provider) gets it put before each text, which is what
        sentence-transformers itself sends through the model."""
        if prompt is not None and self._takes_prompt:
            return self._encoder.encode(texts, prompt=prompt)
        return self._encoder.encode(self.model_inputs(texts, prompt))

    def _compute(self, vectors: torch.Tensor, served: np.ndarray, positions: np.ndarray, unique_keys: KeyList,
                 unique_texts: list[str], *, prompt: str | None, num_sync: int = 1) -> int:
        """Compute the keys at ``positions`` into ``vectors`` and write them up; returns how many were computed.

        The batcher has already stored computed vectors in L1, so the write-up starts at L2. A key another
        caller's computation put into L1 meanwhile comes back as an L1 hit (``peeked``)."""
        keys = unique_keys.take(positions)
        below = len(self.levels)
        texts = [unique_texts[i] for i in positions]
        if self._tracer is None:  # tracing off: no span, not even a call that finds nothing to do (as cache.py, levels.py)
            outcome = self.batcher.compute_detailed(keys, texts, prompt=prompt)
        else:  # the span covers this caller's wait: the batcher may add other callers' texts to the model call
            with span(self._tracer, "ragcache.compute", {"ragcache.num_texts": len(keys)}):
                outcome = self.batcher.compute_detailed(keys, texts, prompt=prompt)
        if outcome.failure is not None:
            if outcome.done:
                self.levels.write_up(below, [keys[i] for i in outcome.done], outcome.vectors, num_sync=num_sync, first=1)
            raise outcome.failure
        vectors.index_copy_(0, torch.from_numpy(positions).to(self._device), outcome.vectors.to(self._device, self._dtype))
        if outcome.peeked:
            served[positions[outcome.peeked]] = 0
            computed = np.ones(len(positions), dtype=bool)
            computed[outcome.peeked] = False
            keys = keys.take(np.flatnonzero(computed))
            if keys:
                self.levels.write_up(below, keys, outcome.vectors[torch.from_numpy(computed)], num_sync=num_sync, first=1)
            return len(keys)
        self.levels.write_up(below, keys, outcome.vectors, num_sync=num_sync, first=1)
        return len(positions)

    def _compute_once_across_processes(self, flight: Flight, vectors: torch.Tensor, served: np.ndarray, missing: np.ndarray,
                                       unique_keys: KeyList, unique_texts: list[str], prompt: str | None) -> int:
        """Compute the missing keys this process wins, wait for the others' vectors, compute what never came.

        Computed vectors go to the shared level (L2) synchronously before the claim is released, so a waiting
        replica finds them there. Won keys are computed *before* waiting: two replicas that each won
        what the other waits for then never wait on each other.
        """
        shared = self._shared
        assert shared is not None, "checked at construction"
        won = np.array(flight.claim([unique_keys[i] for i in missing]), dtype=bool)
        mine, theirs = missing[won], missing[~won]
        num_computed = 0
        if len(mine):
            try:
                num_computed += self._compute(vectors, served, mine, unique_keys, unique_texts, prompt=prompt, num_sync=shared + 1)
            finally:
                flight.release([unique_keys[i] for i in mine])
        if len(theirs):
            found = flight.wait([unique_keys[i] for i in theirs], lambda keys: self.levels.peek(shared, keys))
            if found:
                offsets = sorted(found)
                arrived, arrived_vectors = theirs[offsets], torch.stack([found[o] for o in offsets])
                vectors.index_copy_(0, torch.from_numpy(arrived).to(self._device), arrived_vectors.to(self._device, self._dtype))
                served[arrived] = shared
                self.levels.write_up(shared, unique_keys.take(arrived), arrived_vectors)  # L1 reuses their digests
            never = np.array([i for o, i in enumerate(theirs) if o not in found], dtype=missing.dtype)
            if len(never):
                num_computed += self._compute(vectors, served, never, unique_keys, unique_texts, prompt=prompt, num_sync=shared + 1)
        return num_computed

    def close(self) -> None:
        """Compute what is pending, then stop the batcher's worker."""
        self.batcher.close()
