"""Logs without floods: a warning that repeats (every tick of a loop while a store is down) is logged once, then at
most once an interval, with how many like it were held back in between.

    log = logging.getLogger(__name__)
    log.addFilter(RepeatedWarnings())  # where a loop may say the same thing every tick

A warning is "the same" as another when it comes from the same logger with the same message template (its
arguments, such as the error's text, may differ): ``"prefix store unavailable: %s"`` once a tick for 45 s was 109
lines, and is now one, then at most one a minute saying how many it stood for. The template is a finite set (the
code's), so what the filter remembers stays small.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["DropMessages", "RepeatedWarnings"]


class DropMessages(logging.Filter):
    """A logger filter that drops records whose message starts with one of ``prefixes``: for a dependency's line that
    says nothing a reader can act on (each use says why, where it installs one)."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.prefixes))


class RepeatedWarnings(logging.Filter):
    """A logger filter that lets the first of a repeated warning (or error) through, then one an ``interval_s``, the
    message then ending with how many were held back; records below ``level`` always pass."""

    def __init__(self, interval_s: float = 60.0, *, level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.level = level
        self._clock = clock
        self._lock = threading.Lock()
        # (logger, level, template) -> [when the last one passed, how many were held back since]
        self._seen: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.interval_s:
                seen[1] += 1
                return False
            held_back = int(seen[1]) if seen is not None else 0
            self._seen[key] = [now, 0]
        if held_back:
            # Into the message, not the template: a formatter shows it whatever its format string.
            record.msg = f"{record.getMessage()} ({held_back} more like this held back since the last one logged)"
            record.args = None
        return True
