"""A warning a loop repeats every tick is logged once, then once an interval with the count it stood for."""

from __future__ import annotations

import logging

from ragcache.observe import RepeatedWarnings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_warning_is_logged_once_an_interval_with_a_count(caplog):
    clock = Clock()
    log = logging.getLogger("tests.repeated")
    log.addFilter(RepeatedWarnings(60.0, clock=clock))
    with caplog.at_level(logging.INFO, logger="tests.repeated"):
        for tick in range(109):  # a 0.4 s loop for 45 s against a store that is down
            clock.now = tick * 0.4
            log.warning("prefix store unavailable, warming the last known list: %s", f"refused ({tick})")
            log.info("an info line passes every time")
        clock.now = 61.0
        log.warning("prefix store unavailable, warming the last known list: %s", "refused (again)")
        log.warning("another warning is its own")
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [
        "prefix store unavailable, warming the last known list: refused (0)",
        "prefix store unavailable, warming the last known list: refused (again) (108 more like this held back since the "
        "last one logged)",
        "another warning is its own",
    ]
    assert sum(record.levelno == logging.INFO for record in caplog.records) == 109
