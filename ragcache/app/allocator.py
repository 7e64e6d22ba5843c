"""glibc's malloc, told to keep freed memory for reuse: for a server that allocates and frees megabytes per request.

By default glibc gives memory back to the OS as soon as more than ``M_TRIM_THRESHOLD`` is free at the top of
its heap, and serves blocks above ``M_MMAP_THRESHOLD`` with fresh mappings (both start at 128 KiB and rise
with what the process frees). A model batch's activations (a few MiB each) and a 1,000-vector Redis reply
(1.5 MiB) are then mapped again and page-faulted in on many requests: on a VM each fault is a nested page walk.
Measured here (2 cores, the cold stream's first 25 model batches, one process per run, three pairs): 2-4%
less model time per batch with memory kept; `ragcache bench l2`'s MGET floor ran 2x faster without faults.

The price is resident memory: up to ``retain_bytes`` freed memory stays with the process instead of going back
to the OS. The service calls this once at start-up (``malloc_retain_bytes``); the library never does, as it is
the whole process' allocator.
"""

from __future__ import annotations

import ctypes
import logging
import os

__all__ = ["retain_freed_memory"]

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2: 32 MiB on 64-bit.
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024


def retain_freed_memory(retain_bytes: int) -> bool:
    """Keep up to ``retain_bytes`` of freed memory for reuse, and serve blocks up to ``min(retain_bytes, 32 MiB)``
    from the heap. False, changing nothing, for 0 or where the C library is not glibc."""
    if retain_bytes <= 0 or not _is_glibc():
        return False
    libc = ctypes.CDLL(None)
    # mallopt answers 1 when it took the value (it also stops adjusting both thresholds on its own).
    taken = libc.mallopt(M_MMAP_THRESHOLD, min(retain_bytes, MAX_MMAP_THRESHOLD)) == 1
    taken = libc.mallopt(M_TRIM_THRESHOLD, retain_bytes) == 1 and taken
    if not taken:
        log.warning("glibc refused the malloc thresholds for malloc_retain_bytes=%d; its defaults stay", retain_bytes)
    return taken


def _is_glibc() -> bool:
    # confstr answers at once ("glibc 2.36"); platform.libc_ver() would read the Python binary to find out.
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):  # a C library that does not know the name
        return False
