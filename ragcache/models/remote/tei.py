"""Hugging Face text-embeddings-inference's native ``POST {base_url}/embed``.

TEI serves one model (the upstream model id is not sent) and takes ``normalize`` (its default is true, so
ragcache always says which it wants), ``truncate`` and ``prompt_name``; it answers a bare JSON list of
vectors in input order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ragcache.models.remote.http import RemoteEncoder, decode_matrix

__all__ = ["TEIEncoder"]


class TEIEncoder(RemoteEncoder):
    path = "/embed"
    reads_token_ids = True  # TEI's OpenAPI: ``inputs`` may be lists of token ids

    def request_body(self, texts: list[Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"inputs": texts, "normalize": self.model.normalize, "truncate": self.model.truncate}
        if self.model.prompt_name is not None:
            body["prompt_name"] = self.model.prompt_name
        return body

    def parse(self, answer: Any, num_texts: int) -> tuple[np.ndarray, int | None]:
        return decode_matrix(answer, num_texts), None
