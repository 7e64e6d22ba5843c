"""A small, strict MessagePack decoder: what vLLM's KV events are encoded in (``msgspec.msgpack``, arrays of fields).

Written here rather than depending on msgpack or msgspec for the few types those events use (nil, booleans, integers,
floats, strings, bytes, arrays, maps, and the extension types read as opaque bytes). It is strict because the bytes
come from the network: a truncated or malformed frame, nesting deeper than ``MAX_DEPTH`` or a container claiming
more items than there are bytes left is a :class:`MsgpackError`, never an exception of another kind, a hang or an
allocation the frame's size does not justify. The objects a frame decodes to are costed as they are made (roughly
CPython's sizes: an empty map is one byte on the wire and some 64 bytes decoded) and ``max_cost`` bounds their sum, so
memory follows the frame's size by a known factor whatever its bytes say (issue 38, item 5).
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["MsgpackError", "unpackb"]

MAX_DEPTH = 32


class MsgpackError(ValueError):
    """The bytes are not one well-formed MessagePack value."""


# Approximate CPython sizes, in bytes, of what a value decodes to, plus the 8-byte slot it takes in its container.
_SLOT = 8
_COST_INT = 32  # ints outside CPython's cached -5..256
_COST_FLOAT = 24
_COST_STR = 49
_COST_BYTES = 33
_COST_LIST = 56
_COST_DICT = 64
_COST_DICT_ITEM = 48
# A frame's own floor: the few objects of the smallest batch.
MIN_COST = 4096


def unpackb(data: bytes, max_cost: int | None = None) -> Any:
    """The one value ``data`` encodes; :class:`MsgpackError` when it is not exactly one well-formed value, or when
    the objects it decodes to would cost more than ``max_cost`` bytes (at least ``MIN_COST``; None: no bound)."""
    reader = _Reader(memoryview(data), None if max_cost is None else max(max_cost, MIN_COST))
    value = reader.value(0)
    if reader.pos != len(data):
        raise MsgpackError(f"{len(data) - reader.pos} bytes after the value")
    return value


_FIXED = {0xC0: None, 0xC2: False, 0xC3: True}
_STRUCTS = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
            0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
_LENGTHS = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xD9: ">B", 0xDA: ">H", 0xDB: ">I",
            0xDC: ">H", 0xDD: ">I", 0xDE: ">H", 0xDF: ">I", 0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


class _Reader:
    def __init__(self, data: memoryview, budget: int | None) -> None:
        self.data = data
        self.pos = 0
        self.budget = budget

    def spend(self, cost: int) -> None:
        if self.budget is not None:
            self.budget -= cost + _SLOT
            if self.budget < 0:
                raise MsgpackError("decodes to more objects than its size allows")

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise MsgpackError("truncated")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise MsgpackError(f"nested deeper than {MAX_DEPTH}")
        byte = self.take(1)[0]
        if byte <= 0x7F or byte >= 0xE0:
            self.spend(0)  # a cached small int: its slot only
            return byte if byte <= 0x7F else byte - 0x100
        if 0xA0 <= byte <= 0xBF:
            return self.string(byte & 0x1F)
        if 0x90 <= byte <= 0x9F:
            return self.array(byte & 0x0F, depth)
        if 0x80 <= byte <= 0x8F:
            return self.map(byte & 0x0F, depth)
        if byte in _FIXED:
            self.spend(0)
            return _FIXED[byte]
        if byte in _STRUCTS:
            number = self.unpack(_STRUCTS[byte])
            self.spend(_COST_FLOAT if isinstance(number, float) else 0 if -5 <= number <= 256 else _COST_INT)
            return number
        if byte in _FIXEXT:
            self.take(1)  # the extension's type: its payload is kept as opaque bytes
            self.spend(_COST_BYTES + _FIXEXT[byte])
            return bytes(self.take(_FIXEXT[byte]))
        if byte in _LENGTHS:
            return self.sized(byte, self.unpack(_LENGTHS[byte]), depth)
        raise MsgpackError(f"no MessagePack type starts with 0x{byte:02x}")

    def sized(self, byte: int, n: int, depth: int) -> Any:
        if byte in (0xC4, 0xC5, 0xC6):
            self.spend(_COST_BYTES + n)
            return bytes(self.take(n))
        if byte in (0xD9, 0xDA, 0xDB):
            return self.string(n)
        if byte in (0xDC, 0xDD):
            return self.array(n, depth)
        if byte in (0xDE, 0xDF):
            return self.map(n, depth)
        self.take(1)  # ext 8/16/32: its type, then n bytes of payload
        self.spend(_COST_BYTES + n)
        return bytes(self.take(n))

    def string(self, n: int) -> str:
        self.spend(_COST_STR + n)
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError:
            raise MsgpackError("a string that is not UTF-8") from None

    def array(self, n: int, depth: int) -> list[Any]:
        if n > len(self.data) - self.pos:  # every item takes one byte at least
            raise MsgpackError("an array longer than the bytes left")
        self.spend(_COST_LIST)
        return [self.value(depth + 1) for _ in range(n)]

    def map(self, n: int, depth: int) -> dict[Any, Any]:
        if 2 * n > len(self.data) - self.pos:
            raise MsgpackError("a map longer than the bytes left")
        self.spend(_COST_DICT + _COST_DICT_ITEM * n)
        out: dict[Any, Any] = {}
        for _ in range(n):
            key = self.value(depth + 1)
            try:
                out[key] = self.value(depth + 1)
            except TypeError:
                raise MsgpackError("a map key that cannot be a key") from None
        return out
