"""Any OpenAI-compatible ``POST {base_url}/embeddings``: OpenAI itself, vLLM's pooling models, Infinity,
TEI's OpenAI route, Ollama's ``/v1``.

Vectors travel as base64 (``encoding_format="base64"``: the raw little-endian float32 bytes, a quarter of
the JSON size and exact); an answer in JSON numbers is accepted too (some servers ignore the format), and
is exact as well for numbers printed from float32.
"""

from __future__ import annotations

import binascii
from typing import Any

import numpy as np
import pybase64

from ragcache.models.remote.http import RemoteEncoder, decode_matrix

__all__ = ["OpenAIEncoder"]


class OpenAIEncoder(RemoteEncoder):
    path = "/embeddings"
    reads_token_ids = True  # OpenAI's reference: ``input`` may be a list of lists of token ids

    def request_body(self, texts: list[Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model.upstream_model, "input": texts, "encoding_format": "base64"}
        if self.model.send_dimensions:
            body["dimensions"] = self.model.dimensions
        return body

    def parse(self, answer: Any, num_texts: int) -> tuple[np.ndarray, int | None]:
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
            raise ValueError("expected an object with a list 'data'")
        data = answer["data"]
        if len(data) != num_texts:
            raise ValueError(f"{len(data)} vectors for {num_texts} texts")
        indices = [item.get("index") if isinstance(item, dict) else None for item in data]
        # In order, or refused: an upstream that reorders might also have mismatched texts and vectors.
        if indices != list(range(num_texts)):
            raise ValueError(f"the indices are not 0..{num_texts - 1} in order: {indices[:8]}")
        embeddings = [item.get("embedding") for item in data]
        usage = answer.get("usage")
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if all(isinstance(e, str) for e in embeddings):
            return _decode_base64(embeddings), tokens
        return decode_matrix(embeddings, num_texts), tokens


def _decode_base64(rows: list[str]) -> np.ndarray:
    """The rows as one float32 matrix. Rows of one length without padding (a vector of a multiple of 3 bytes: 384
    float32 are 1,536) are joined and decoded in one call into a bytearray that becomes the matrix's buffer (no copy
    after the decode, and writable like every matrix an encoder returns); others row by row."""
    width = len(rows[0]) if rows else 0
    if width and width % 4 == 0 and all(len(row) == width for row in rows) and not any(row.endswith("=") for row in rows):
        try:
            buffer = pybase64.b64decode_as_bytearray("".join(rows), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("an embedding is not valid base64") from None
        if (width // 4 * 3) % 4:
            raise ValueError("the base64 embeddings are not float32 vectors of one length")
        return np.frombuffer(buffer, dtype="<f4").reshape(len(rows), -1).astype(np.float32, copy=False)
    try:
        decoded = [pybase64.b64decode(row, validate=True) for row in rows]
    except (binascii.Error, ValueError):
        raise ValueError("an embedding is not valid base64") from None
    lengths = {len(raw) for raw in decoded}
    if len(lengths) != 1 or next(iter(lengths)) % 4:
        raise ValueError("the base64 embeddings are not float32 vectors of one length")
    return np.frombuffer(b"".join(decoded), dtype="<f4").reshape(len(rows), -1).astype(np.float32)
