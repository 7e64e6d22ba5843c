"""Counting a prefix's tokens with the target model's own tokenizer, when it is on this machine."""

from __future__ import annotations

import functools
import logging
from typing import Any

from .model import Target

__all__ = ["LocalTokenCounter"]

log = logging.getLogger(__name__)


class LocalTokenCounter:
    """Counts tokens with ``transformers.AutoTokenizer`` loaded from local files only.

    Returns None when the served model's tokenizer is not available locally (a served name that is
    not a local path nor in the Hugging Face cache); the registry then asks vLLM's ``/tokenize``.
    ``model_paths`` maps served model names to local tokenizer folders where they differ.
    """

    def __init__(self, model_paths: dict[str, str] | None = None) -> None:
        self._model_paths = dict(model_paths or {})

    @functools.lru_cache(maxsize=16)  # noqa: B019 - a handful of models per process, kept for its lifetime
    def _tokenizer(self, model: str) -> Any | None:
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(self._model_paths.get(model, model), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure to load just means "not available here"
            log.debug("no local tokenizer for %s: %s", model, exc)
            return None

    def __call__(self, target: Target, text: str) -> int | None:
        tokenizer = self._tokenizer(target.model)
        if tokenizer is None:
            return None
        # add_special_tokens matches what vLLM's /tokenize and completions count (BOS included).
        return len(tokenizer(text, add_special_tokens=True)["input_ids"])
