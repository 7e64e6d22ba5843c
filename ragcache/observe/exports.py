"""A package's public names, each imported on first use (PEP 562 ``__getattr__``).

A room's ``__init__`` lists the names it exports with the module that defines each; the module is imported the
first time one of its names is read, so importing the package stays cheap (the HTTP client reaches several rooms
and must not pull in torch or pymilvus) while its surface is written out in one place. It lives in this room, the
lowest package, so that every room above can use it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = ["lazy_exports"]


def lazy_exports(package: str, modules: Mapping[str, Sequence[str]]) -> tuple[list[str], Callable[[str], object]]:
    """``(__all__, __getattr__)`` for ``package``; ``modules`` maps each module, relative to the package
    (``".cache"``), to the names it exports."""
    module_of = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name], package), name)
        setattr(sys.modules[package], name, value)  # the next read is a plain attribute
        return value

    return list(module_of), __getattr__
