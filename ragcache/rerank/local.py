"""A local cross-encoder (sentence-transformers ``CrossEncoder``), loaded from a folder or the local cache."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ragcache.errors import ConfigError
from ragcache.models.local import fingerprint_folder, fingerprint_weights
from ragcache.rerank.base import score_space
from ragcache.tiers.memory import resolve_device

__all__ = ["CrossEncoderReranker"]


class CrossEncoderReranker:
    """``score(pairs)``: the model's sigmoid relevance per pair, one forward pass at a time (a lock), as the
    embedding model is used; callers are batched together upstream by the score cache."""

    def __init__(self, model: str, *, device: str = "auto", batch_size: int = 32, max_length: int | None = None):
        from sentence_transformers import CrossEncoder  # slow import: only when a reranker is configured

        self.name = model
        try:
            # local_files_only: never reach for a hub at run time.
            self.model = CrossEncoder(model, device=str(resolve_device(device)), local_files_only=True, max_length=max_length)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load cross-encoder {model!r} offline: {exc}") from exc
        if self.model.num_labels != 1:
            raise ConfigError(f"cross-encoder {model!r} has {self.model.num_labels} labels; a reranker gives one score")
        self.model.eval()
        self.batch_size = batch_size
        self.tokenizer = self.model.tokenizer
        folder = Path(model)
        revision = fingerprint_folder(folder) if folder.is_dir() else fingerprint_weights(self.model)
        self.space = score_space(model, revision, self.model.max_seq_length)
        self._lock = threading.Lock()

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        with self._lock, torch.inference_mode():
            scores = self.model.predict(list(pairs), batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True)
        return np.asarray(scores, dtype=np.float32).reshape(len(pairs))

    def count_tokens(self, query: str, texts: Sequence[str]) -> list[int]:
        """Tokens of each (query, text) pair as the model sees it before truncation."""
        encoded = self.tokenizer([[query, text] for text in texts], truncation=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def close(self) -> None:
        """Nothing to release: the weights go with the object."""
