"""The stored value of a vector, shared by every level that keeps bytes (L2 Redis, the disk level).

Value layout (little-endian), 16 bytes of header then ``dim * itemsize`` bytes of vector:

    magic b"RC" | format version u8 | dtype code u8 | dim u32 | xxh3-64 of the vector bytes u64 | vector

A value whose header, length or checksum does not match what this space expects (corrupt, truncated, torn by a
crash, written by another format version or for another dtype/dim) is reported corrupt, never decoded.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import torch
import xxhash

__all__ = ["HEADER", "decode_values", "encode_rows", "encode_value"]

MAGIC = b"RC"
FORMAT_VERSION = 1
HEADER = struct.Struct("<2sBBIQ")
DTYPE_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
# numpy has no bfloat16: its bytes travel as int16 and are reinterpreted by torch.
NUMPY_STORAGE = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}


def encode_value(vector_bytes: bytes, dtype: torch.dtype, dim: int) -> bytes:
    """One stored value: header + raw little-endian vector bytes."""
    checksum = xxhash.xxh3_64_intdigest(vector_bytes)
    return HEADER.pack(MAGIC, FORMAT_VERSION, DTYPE_CODES[dtype], dim, checksum) + vector_bytes


def encode_rows(vectors: torch.Tensor, dtype: torch.dtype, dim: int) -> list[bytes]:
    """One stored value per row of ``vectors`` (cast to ``dtype``)."""
    return [encode_value(row.tobytes(), dtype, dim) for row in as_le_bytes(vectors.to(dtype))]


def as_le_bytes(vectors: torch.Tensor) -> np.ndarray:
    """Rows of raw little-endian bytes, one row per vector (this machine is little-endian, as is x86/ARM)."""
    storage = vectors.detach().cpu().contiguous()
    if storage.dtype == torch.bfloat16:
        storage = storage.view(torch.int16)
    array = storage.numpy()
    return array.view(np.uint8).reshape(len(array), -1)


def decode_values(values: Sequence[bytes | None], dtype: torch.dtype, dim: int) -> tuple[list[int], torch.Tensor, list[int]]:
    """Validate and decode a batch of stored values.

    Returns (positions of valid values, their vectors stacked, positions of corrupt values). ``None``
    values (absent keys) are in neither list. The header checks run on the whole batch at once (one join,
    numpy comparisons); only the checksum is computed value by value.
    """
    row_bytes = dim * torch.empty((), dtype=dtype).element_size()
    expected_len = HEADER.size + row_bytes
    if None not in values and set(map(len, values)) == {expected_len}:  # type: ignore[arg-type]
        # The common case, judged in C: every key present and every value the right size.
        sized, corrupt = list(range(len(values))), []
        joined = b"".join(values)  # type: ignore[arg-type]
    else:
        present = [position for position, value in enumerate(values) if value is not None]
        sized = [position for position in present if len(values[position]) == expected_len]  # type: ignore[arg-type]
        corrupt = [position for position in present if len(values[position]) != expected_len]  # type: ignore[arg-type]
        if not sized:
            return [], torch.empty((0, dim), dtype=dtype), corrupt
        joined = b"".join([values[position] for position in sized])  # type: ignore[misc]
    table = np.frombuffer(joined, dtype=np.uint8).reshape(len(sized), expected_len)
    expected_head = np.frombuffer(HEADER.pack(MAGIC, FORMAT_VERSION, DTYPE_CODES[dtype], dim, 0)[:8], dtype=np.uint8)
    head_ok = (table[:, :8] == expected_head).all(axis=1)
    stored_checksums = table[:, 8:16].copy().view("<u8").ravel()
    view, checksum_of = memoryview(joined), xxhash.xxh3_64_intdigest
    computed = np.fromiter(
        (checksum_of(view[start + HEADER.size : start + expected_len]) for start in range(0, len(joined), expected_len)),
        dtype=np.uint64,
        count=len(sized),
    )
    ok = head_ok & (stored_checksums == computed)
    valid = sized
    if not ok.all():
        valid = [position for position, good in zip(sized, ok) if good]
        corrupt = sorted(corrupt + [position for position, good in zip(sized, ok) if not good])
        table = table[ok]
    raw = table[:, HEADER.size :].copy().view(NUMPY_STORAGE[dtype])  # copy: contiguous and writable
    vectors = torch.from_numpy(raw)
    if dtype == torch.bfloat16:
        vectors = vectors.view(torch.bfloat16)
    return valid, vectors, corrupt
