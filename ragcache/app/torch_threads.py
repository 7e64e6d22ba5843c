"""torch's intra-op threads for the service: one when no model computes in this process.

torch runs an operation on more than 32,768 elements (an ``index_select`` of 86 rows of 384 floats, a ``cat`` of a
few 32-text batches) on its OpenMP pool, whose threads then spin before they sleep. When every model is remote,
the only tensor work in the process is the cache's own (L1's rows, the codec's copies), all of it small, and the
pool's spinning costs more than the parallel copy saves: measured here (2 cores, in process, an instant remote
upstream), 192-text calls cost 0.145 ms of CPU a text on torch's default pool against 0.046 on one thread, while
32- and 64-text calls (under the threshold) cost the same either way. A local model's forward pass does want
the pool, so with one, torch's default stays unless ``torch_threads`` says otherwise.

The service enters it for its lifetime, before any worker thread exists (``torch_threads``); the library never
does, as the setting is the whole process'.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["torch_threads"]

log = logging.getLogger(__name__)


@contextmanager
def torch_threads(requested: int, *, any_local_model: bool) -> Iterator[int | None]:
    """torch's intra-op threads set to ``requested`` (0: one, unless ``any_local_model``) while inside, torch's own
    count again after; yields the number set, or None when torch's default stays (0 with a local model).

    torch keeps the count per thread, taken by each thread from the process' count when it first runs an
    operation: entered before the service starts its worker threads, it holds for all of them; threads that ran
    an operation before keep their own (the caller's is set too)."""
    if requested == 0 and any_local_model:
        yield None
        return
    import torch  # here: the command starts without loading torch

    before = torch.get_num_threads()
    threads = requested or 1
    torch.set_num_threads(threads)
    log.info("torch uses %d intra-op thread(s) (torch_threads=%d)", threads, requested)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)
