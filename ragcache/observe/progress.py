"""Progress bars for the long commands (ingest, bench): on stderr, so stdout stays the command's answer."""

from __future__ import annotations

import sys

from tqdm import tqdm

__all__ = ["progress_bar"]


def progress_bar(*, desc: str, unit: str, total: int | None = None, quiet: bool = False) -> tqdm:
    """A tqdm bar on stderr; off with ``quiet``, and off by itself when stderr is not a terminal
    (``disable=None``), so logs and pipes never fill with carriage returns."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=True if quiet else None, dynamic_ncols=True)
