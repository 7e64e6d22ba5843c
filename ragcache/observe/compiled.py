"""Compiled loops with a Python twin of the same signatures, one implementation chosen once at import, the choice
visible (as redis-py chooses hiredis or its Python parser and says so in ``HIREDIS_AVAILABLE``).

A pair is a C extension built by ``pip install`` where a C compiler is (optional: pyproject's ``ext-modules``) and a
module of the same functions in Python/numpy, which give the same results: ``ragcache.tiers._lru_kernels`` and
``ragcache.tiers._lru_loops`` (the L1 key map), ``ragcache_server._base64_answer`` and
``ragcache_server._base64_answer_py`` (OpenAI's base64 answer). ``choose`` imports the compiled one or takes the
twin, logs a warning when the compiled one is missing (an install without a compiler silently ran the slower loops),
and records the choice: ``implementations()`` is what ``/info`` and ``ragcache config`` show. The tests run every
pair's tests over both (the ``implementation`` fixture in tests/conftest.py).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

__all__ = ["CompiledPair", "choose", "implementations"]

log = logging.getLogger(__name__)

Implementation = Literal["compiled", "python"]


@dataclass(frozen=True)
class CompiledPair:
    """One pair: ``compiled`` (None where it was not built), its Python ``twin``, and the one that serves."""

    name: str
    compiled: ModuleType | None
    twin: ModuleType

    @property
    def serving(self) -> ModuleType:
        return self.compiled if self.compiled is not None else self.twin

    @property
    def implementation(self) -> Implementation:
        return "compiled" if self.compiled is not None else "python"

    def of(self, implementation: Implementation) -> ModuleType:
        """The module of ``implementation`` (for tests that run over both); LookupError: the compiled one is not built."""
        if implementation == "python":
            return self.twin
        if self.compiled is None:
            raise LookupError(f"the compiled {self.name} is not built here")
        return self.compiled


_CHOSEN: dict[str, CompiledPair] = {}


def choose(name: str, compiled_module: str, twin: ModuleType) -> CompiledPair:
    """Import ``compiled_module`` or fall back to ``twin`` (with a warning), once; the choice is recorded."""
    try:
        compiled: ModuleType | None = importlib.import_module(compiled_module)
    except ImportError as exc:
        compiled = None
        log.warning("ragcache: the compiled %s (%s) is not built (%s): its Python twin %s serves, slower. Reinstall "
                    "with a C compiler and the Python headers (gcc, python3-dev) to build it.", name, compiled_module,
                    exc, twin.__name__)
    pair = _CHOSEN[name] = CompiledPair(name, compiled, twin)
    return pair


def implementations() -> dict[str, Implementation]:
    """Which implementation serves each pair imported in this process: ``{"lru_kernels": "compiled", ...}``."""
    return {name: pair.implementation for name, pair in sorted(_CHOSEN.items())}
