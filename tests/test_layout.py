"""The layout's promises, checked on the source: the library never imports the HTTP layer or the benchmarks, and the
wheel holds only this project's own top-level packages."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The HTTP layer and the benchmarks sit above the library; the library must work without them installed.
ABOVE_THE_LIBRARY = ("fastapi", "starlette", "uvicorn", "ragcache_server", "ragcache_bench", "ragcache_testing")
# The command line is the shell over everything: it starts the server (uvicorn) and finds the benchmarks when installed.
SHELL = {"ragcache/cli.py"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_library_never_imports_the_http_layer_or_the_benchmarks():
    offenders = []
    for path in sorted((ROOT / "ragcache").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in SHELL:
            continue
        for name in imported_modules(path):
            if name.split(".")[0] in ABOVE_THE_LIBRARY:
                offenders.append(f"{relative}: {name}")
    assert offenders == []


def test_the_library_holds_no_benchmark_code():
    assert not (ROOT / "ragcache" / "bench").exists()
    assert (ROOT / "benchmarks" / "ragcache_bench" / "__init__.py").exists()


def test_the_wheel_installs_only_this_projects_own_top_level_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert included == ["ragcache*", "ragcache_server*"]
    top_level = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert top_level - {"tests"} == {"ragcache", "ragcache_server"}
