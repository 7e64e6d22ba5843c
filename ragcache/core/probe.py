"""Where a resident probe stopped (``EmbeddingCache.probe``), and how probes carry on into a walk: several requests'
probes joined into one group's (``EmbeddingCache.embed_requests``), a probe's answer per input taken per distinct key.
L1's answer in a probe is the walk's first step, so a missed text asks L1 once on the event loop and once more only
in the batcher's last look before the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ragcache.core.keys import EmbeddingSpace, KeyList
from ragcache.core.scope import Scope
from ragcache.core.tier import TierHits

__all__ = ["Probe", "first_of_unique", "joined_probe"]


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
