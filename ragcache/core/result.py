"""What a cache call hands back: ``EmbedResult`` (vectors in input order, and the level that served each) and the
small steps that make one from a walk's vectors (numpy or a tensor, normalised when asked; one request's part of
several walked as one); or, from a resident probe (``EmbeddingCache.probe``) that L1 could not answer whole, a
``Probe``: where it stopped, which a walk carries on from.

A probe's L1 answer is the walk's first step: several requests' probes are joined into one group's
(``EmbeddingCache.embed_requests``), and a probe's answer per input is taken per distinct key, so a missed text asks
L1 once on the event loop and once more only in the batcher's last look before the model. One module for both
outcomes: a probe and its continuation meet on every miss, and were two files on that path for no concern of
their own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ragcache.core.keys import EmbeddingSpace, KeyList
from ragcache.core.scope import Scope
from ragcache.core.tier import TierHits

__all__ = ["EmbedResult", "Probe", "finished", "first_of_unique", "joined_probe", "served_attributes", "spans", "to_numpy"]


@dataclass(frozen=True)
class EmbedResult:
    """Vectors in input order, and where each came from."""

    vectors: np.ndarray | torch.Tensor
    levels: np.ndarray  # per input: position of the level that served it; len(level_names) - 1 = computed
    level_names: tuple[str, ...]  # e.g. ("L1", "L2", "L3", "compute")

    @property
    def served(self) -> dict[str, int]:
        """How many inputs each level served (duplicates inside a request count each time)."""
        counts = np.bincount(self.levels, minlength=len(self.level_names))
        return {name: int(count) for name, count in zip(self.level_names, counts)}


def spans(requests: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """Each request's (start, end) in the requests' texts laid end to end."""
    ends = np.cumsum([len(request) for request in requests]).tolist()
    return list(zip([0, *ends[:-1]], ends))


def finished(vectors: torch.Tensor, levels: np.ndarray, level_names: tuple[str, ...], *, normalize: bool,
             dtype: torch.dtype, as_tensor: bool = False) -> EmbedResult:
    """The result of a walk's vectors (numpy unless ``as_tensor``), normalised when asked."""
    if normalize:
        vectors = torch.nn.functional.normalize(vectors.float(), dim=-1).to(dtype)
    return EmbedResult(vectors if as_tensor else to_numpy(vectors), levels, level_names)


def served_attributes(result: EmbedResult) -> dict[str, int]:
    """A span's attributes: how many inputs each level served."""
    return {f"ragcache.served.{name}": count for name, count in result.served.items()}


def to_numpy(vectors: torch.Tensor) -> np.ndarray:
    # numpy has no bfloat16: those vectors widen to float32, which is exact.
    if vectors.dtype == torch.bfloat16:
        vectors = vectors.float()
    return vectors.numpy() if vectors.is_cpu else vectors.cpu().numpy()  # .cpu() is a torch call even on the CPU


@dataclass(frozen=True)
class Probe:
    """Where a resident probe (``EmbeddingCache.probe``) stopped when L1 did not hold every text: the request's
    space, prepared texts and keys (hashed once) and what L1 held. ``embed_detailed(..., probe=)`` continues
    from it instead of preparing, hashing and asking L1 again."""

    space: EmbeddingSpace
    texts: list[str]
    keys: KeyList
    first: TierHits
    started: float
    scope: Scope


def joined_probe(probes: Sequence[Probe], scope: Scope) -> Probe | None:
    """Several requests' probes as one request's, in order; None when they are not of one space and ``scope`` (a
    drift switch between them): the walk then asks L1 itself."""
    head = probes[0]
    if any(probe.space != head.space or probe.scope != scope for probe in probes):
        return None
    if len(probes) == 1:
        return head
    index: list[int] = []
    offset = 0
    for probe in probes:
        index += [offset + position for position in probe.first.index]
        offset += len(probe.keys)
    # The probes hashed their keys for L1 already: their digests are joined, not made again.
    keys = KeyList([key for probe in probes for key in probe.keys], np.concatenate([probe.keys.digests() for probe in probes]))
    first = TierHits(index, torch.cat([probe.first.vectors for probe in probes]))
    texts = [text for probe in probes for text in probe.texts]
    return Probe(head.space, texts, keys, first, min(probe.started for probe in probes), scope)


def first_of_unique(first: TierHits, first_positions: list[int]) -> TierHits:
    """A probe's L1 answer (per input) as the walk's first step over the distinct keys (at ``first_positions``)."""
    rows = {position: row for row, position in enumerate(first.index)}
    held = [(unique, rows[position]) for unique, position in enumerate(first_positions) if position in rows]
    return TierHits([unique for unique, _ in held], first.vectors[[row for _, row in held]])
