"""An optional age and size budget for L3: Milvus keeps no LRU of its own, so without one L3 grows forever.

Every L3 row records when it was last written (``written_at``, milliseconds since the epoch; a vector
computed again after its row went is written again). At most once per ``check_interval_s``, after a write,
rows older than ``max_age_s`` are deleted, then, when more than ``max_rows`` remain, the oldest written go
until ``max_rows`` are left. The order is by write time, not by use: L3 is read far less than L1 and L2,
which hold the hot vectors, and a read that updated every hit row would double Milvus' load.

By default (``l3_max_rows`` unset) a space keeps ``default_max_rows``: a tenth of the data volume (Milvus Lite) in
rows, at most ``DEFAULT_MAX_ROWS``. Without it L3 grew without end (a 20-minute soak: milvus.db 19.9 -> 41.6 MiB and
its server 199 -> 310 MiB, no sign of levelling). Measured on Milvus Lite 2.5 at 384 dimensions (60,000 rows written
in batches of 2,000): 2,053 bytes of ``milvus.db`` per row (the vector's 1,536 and ~520 of key and overhead) and
~1,480 bytes of the server's resident memory per row (it keeps the vectors in memory). So 1,000,000 rows are ~2 GB on
disk and ~1.5 GB of memory per space at 384 dimensions.

Milvus has no ORDER BY for a delete, so "the oldest ``n``" is found as a write time: the smallest ``t`` with at
least ``n`` rows written before it, by bisection over ``count(*)`` queries (about 40 of them, each one filtered
scan), then one delete by that filter. Rows written in the same millisecond go together, so a check may
delete a few rows more than needed, never fewer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_MAX_ROWS", "L3Budget", "BudgetKeeper", "WRITTEN_AT", "default_max_rows"]

log = logging.getLogger(__name__)

WRITTEN_AT = "written_at"
# The default bound of one space's rows: at most this many, whatever the volume (the server keeps ~a vector per row
# in memory), and on Milvus Lite at most VOLUME_SHARE of its volume.
DEFAULT_MAX_ROWS = 1_000_000
VOLUME_SHARE = 0.10
ROW_OVERHEAD_BYTES = 520  # a row's bytes in milvus.db beyond its vector (measured: see the module docstring)


def default_max_rows(uri: str, dim: int, data_dir: Path, *,
                     statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> int:
    """The rows one L3 space keeps when ``l3_max_rows`` is unset: for Milvus Lite (a ``.db`` path, or the shared
    server of ``--workers`` on a unix socket, whose file is in ``data_dir``) a tenth of its volume's size in rows of
    ``dim`` float32 values, at most ``DEFAULT_MAX_ROWS``; for a server, whose disk is its own, ``DEFAULT_MAX_ROWS``.
    At least 1,000 rows, so that a tiny volume still caches something."""
    if uri.endswith(".db"):
        folder = Path(uri).parent
    elif uri.startswith("unix:"):
        folder = Path(data_dir)
    else:
        return DEFAULT_MAX_ROWS
    while not folder.exists() and folder != folder.parent:  # not made yet: the volume it will be made on
        folder = folder.parent
    volume = statvfs(str(folder))
    row_bytes = dim * 4 + ROW_OVERHEAD_BYTES
    return max(1_000, min(DEFAULT_MAX_ROWS, int(volume.f_blocks * volume.f_frsize * VOLUME_SHARE) // row_bytes))


@dataclass(frozen=True)
class L3Budget:
    """Limits of one L3 collection (one embedding space); None = no limit of that kind."""

    max_rows: int | None = None
    max_age_s: float | None = None
    check_interval_s: float = 60.0

    @property
    def enabled(self) -> bool:
        return self.max_rows is not None or self.max_age_s is not None


class BudgetKeeper:
    """Applies an ``L3Budget`` to one collection through a Milvus client (each call under its deadline)."""

    def __init__(self, client, collection: str, budget: L3Budget, *, clock: Callable[[], float] = time.time):
        self.client = client
        self.collection = collection
        self.budget = budget
        self.clock = clock
        self.num_evicted = 0  # rows deleted by the budget
        self._next_check = 0.0

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def maybe_enforce(self) -> None:
        """Enforce the budget when a check is due (call after a write; raises what the client raises)."""
        now = self.clock()
        if not self.budget.enabled or now < self._next_check:
            return
        self._next_check = now + self.budget.check_interval_s
        now_ms = int(now * 1000)
        if self.budget.max_age_s is not None:
            self._delete_before(now_ms - int(self.budget.max_age_s * 1000))
        if self.budget.max_rows is not None:
            excess = self._count(None) - self.budget.max_rows
            if excess > 0:
                self._delete_before(self._time_with_rows_before(excess, now_ms + 1))

    def _delete_before(self, written_ms: int) -> None:
        num_before = self._count(written_ms)
        if num_before:
            self.client.delete(self.collection, filter=f"{WRITTEN_AT} < {written_ms}")
            self.num_evicted += num_before
            log.info("L3 %s: %d row(s) written before %d ms deleted (budget %s)", self.collection, num_before, written_ms, self.budget)

    def _time_with_rows_before(self, num_rows: int, upper_ms: int) -> int:
        """The smallest write time ``t`` (ms) with at least ``num_rows`` rows written before it."""
        low, high = 0, upper_ms  # count(before low) < num_rows <= count(before high)
        while high - low > 1:
            middle = (low + high) // 2
            if self._count(middle) >= num_rows:
                high = middle
            else:
                low = middle
        return high

    def _count(self, before_ms: int | None) -> int:
        expression = "" if before_ms is None else f"{WRITTEN_AT} < {before_ms}"
        # Strong: the count sees the write that triggered the check and the delete before it (the collection's own
        # level, Bounded by default, may answer from a view a moment old on a server).
        rows = self.client.query(self.collection, filter=expression, output_fields=["count(*)"], consistency_level="Strong")
        return int(rows[0]["count(*)"])
