"""The Python twin of ``_base64_answer.c`` (``ragcache.observe.compiled`` chooses one at import; tests run both):
OpenAI's base64 answer framed row by row, the same bytes and the same refusals."""

from __future__ import annotations

__all__ = ["join_rows"]

# A row's item as orjson writes {"object", "embedding", "index"}: its opening, and what closes row i.
_ROW_OPENING = b'{"object":"embedding","embedding":"'


def join_rows(encoded: bytes | memoryview, width: int, head: bytes, tail: bytes, /) -> bytes:
    """``head``, each ``width``-byte row of ``encoded`` as an item of OpenAI's ``data``, ``tail``; the rows are
    views, copied once, by the join."""
    view = memoryview(encoded)
    if width <= 0 or len(view) % width:
        raise ValueError("join_rows: encoded must be whole rows of width > 0 bytes")
    parts: list[bytes | memoryview] = [head]
    for index, start in enumerate(range(0, len(view), width)):
        parts += (b"," + _ROW_OPENING if index else _ROW_OPENING, view[start : start + width], b'","index":%d}' % index)
    parts.append(tail)
    return b"".join(parts)
