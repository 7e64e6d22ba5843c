"""What a person gets wrong in their settings, said in their own terms: a ``RAGCACHE_*`` variable no option has
(named with the nearest option's), and a value that does not validate (named by its variable, in one line).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping

from pydantic import ValidationError

__all__ = ["ENV_PREFIX", "NOT_SETTINGS", "invalid_settings_message", "unknown_variables"]

ENV_PREFIX = "RAGCACHE_"
# RAGCACHE_* names that are read by the tools around the settings, not by them: not typos.
NOT_SETTINGS = frozenset({
    "RAGCACHE_URL",  # the CLI's service URL (ragcache search/ingest/stats --url)
    "RAGCACHE_SETTINGS_FILE",  # the settings file `ragcache serve --config` hands its workers
    "RAGCACHE_TINY_LLAMA",  # the vLLM tests' model folder
})
# ... and the families of them: the test suite's (RAGCACHE_TEST_REDIS_URL), the benchmarks' launchers
# (RAGCACHE_BARE_MODEL) and their environments' interpreters (RAGCACHE_INFINITY_PYTHON).
NOT_SETTINGS_PREFIXES = ("RAGCACHE_TEST_", "RAGCACHE_BARE_")
NOT_SETTINGS_SUFFIXES = ("_PYTHON",)


def unknown_variables(environ: Mapping[str, str], options: Collection[str]) -> list[str]:
    """One line per ``RAGCACHE_*`` variable of ``environ`` that names no option (``options``: the flat names), with
    the nearest option's variable when one is close: a typo is otherwise silently ignored."""
    known = {ENV_PREFIX + name.upper() for name in options}
    lines = []
    for name in sorted(environ):
        upper = name.upper()  # pydantic-settings reads names case-insensitively
        if not upper.startswith(ENV_PREFIX) or upper in known or _not_a_setting(upper):
            continue
        nearest = difflib.get_close_matches(upper, known, n=1, cutoff=0.75)
        hint = f"; did you mean {nearest[0]}?" if nearest else " (ragcache config --markdown lists every setting)"
        lines.append(f"{name} is not a ragcache setting and is ignored{hint}")
    return lines


def _not_a_setting(name: str) -> bool:
    return name in NOT_SETTINGS or name.startswith(NOT_SETTINGS_PREFIXES) or name.endswith(NOT_SETTINGS_SUFFIXES)


def invalid_settings_message(exc: ValidationError, options: Collection[str]) -> str:
    """pydantic's errors about settings in one line, each named by its variable (``RAGCACHE_L1_BYTES: Input should
    be a valid integer``); the values are never shown (they may be secrets)."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False):
        if error["type"] == "extra_forbidden" and str(error["loc"][-1]).upper().startswith(ENV_PREFIX):
            # A name in a settings file no option has (the environment's are warned of instead: unknown_variables).
            [line] = unknown_variables({str(error["loc"][-1]).upper(): ""}, options)
            parts.append(line.replace("and is ignored", "(in the settings file)"))
            continue
        names = [str(part) for part in error["loc"] if str(part) in options]
        where = ", ".join(ENV_PREFIX + name.upper() for name in names) or ".".join(map(str, error["loc"])) or "settings"
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "invalid settings: " + "; ".join(parts)
