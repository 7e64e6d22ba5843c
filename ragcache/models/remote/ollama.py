"""Ollama's native ``POST {base_url}/api/embed`` (Ollama 0.3.4 and later; the older ``/api/embeddings``
takes one text per call).

It answers ``{"embeddings": [[...], ...], "prompt_eval_count": N}`` in input order; the vectors are unit
length (configure ``normalize = true`` so the space says so).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ragcache.models.remote.http import RemoteEncoder, decode_matrix

__all__ = ["OllamaEncoder"]


class OllamaEncoder(RemoteEncoder):
    path = "/api/embed"

    def request_body(self, texts: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model.upstream_model, "input": texts, "truncate": self.model.truncate}
        if self.model.send_dimensions:
            body["dimensions"] = self.model.dimensions
        return body

    def parse(self, answer: Any, num_texts: int) -> tuple[np.ndarray, int | None]:
        if not isinstance(answer, dict) or not isinstance(answer.get("embeddings"), list):
            raise ValueError("expected an object with a list 'embeddings'")
        return decode_matrix(answer["embeddings"], num_texts), answer.get("prompt_eval_count")
