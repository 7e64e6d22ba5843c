"""The answers' bytes: TEI's list of vectors, OpenAI's ``{"object": "list", "data", "model", "usage"}`` with float or
base64 rows. One place for both shapes, whichever path (the fast path or FastAPI's routes) asked."""

from __future__ import annotations

import numpy as np
import orjson
import pybase64
from starlette.responses import Response

from ragcache.core import EmbedResult
from ragcache.observe import choose
from ragcache_server import _base64_answer_py
from ragcache_server.deps import served_count_headers
from ragcache_server.embedding.plan import EmbedPlan
from ragcache_server.responses import JSONResponse

__all__ = ["answer_of", "join_rows", "openai_base64_answer"]


def answer_of(plan: EmbedPlan, result: EmbedResult, num_tokens: int | None) -> Response:
    """The response to ``plan`` once its vectors are known; ``num_tokens``: OpenAI's ``usage`` (None for TEI)."""
    headers = served_count_headers(result.served)  # X-Cache-*: how many inputs each level served
    if plan.call.shape == "tei":
        return JSONResponse(result.vectors, headers=headers)
    assert num_tokens is not None
    vectors = np.asarray(result.vectors, dtype="<f4")
    if plan.call.encoding == "base64":
        return Response(openai_base64_answer(vectors, plan.model, num_tokens), headers=headers, media_type="application/json")
    data = [{"object": "embedding", "embedding": row, "index": index} for index, row in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": plan.model,
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}, headers=headers)


def openai_base64_answer(vectors: np.ndarray, model: str, num_tokens: int) -> bytes:
    """OpenAI's answer with base64 rows, byte for byte what orjson writes for it, built straight from the row buffer:
    one base64 encoding of the whole matrix (a 384-d float32 row is 1,536 bytes, a multiple of 3, so each row's
    encoding is an exact slice of it), framed by ``_base64_answer.join_rows`` in one pass where it was built."""
    row_bytes = vectors.shape[1] * vectors.itemsize if vectors.ndim == 2 else 0
    if not len(vectors) or not row_bytes:
        encoded, width = b"", 4  # no rows: any width frames nothing
    elif row_bytes % 3:  # rows whose encodings end in padding: encoded one by one, each as wide as the others
        rows = [pybase64.b64encode(row.tobytes()) for row in vectors]
        encoded, width = b"".join(rows), len(rows[0])
    else:
        encoded, width = pybase64.b64encode(np.ascontiguousarray(vectors).data), row_bytes // 3 * 4
    tail = b'],"model":%b,"usage":{"prompt_tokens":%d,"total_tokens":%d}}' % (orjson.dumps(model), num_tokens, num_tokens)
    return join_rows(encoded, width, _ANSWER_HEAD, tail)


_ANSWER_HEAD = b'{"object":"list","data":['
# Compiled where `pip install` found a C compiler, else its Python twin (a warning at import says so).
BASE64_ANSWER = choose("base64_answer", "ragcache_server._base64_answer", _base64_answer_py)
join_rows = BASE64_ANSWER.serving.join_rows
