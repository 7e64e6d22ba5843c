"""What a walk hands back: ``EmbedResult`` (vectors in input order, and the level that served each), and the
small steps that make one from a walk's vectors (numpy or a tensor, normalised when asked; one request's part of
several walked as one)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["EmbedResult", "finished", "served_attributes", "spans", "to_numpy"]


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
