"""The layout's promises, checked on the source: the library never imports the HTTP layer or the benchmarks, the
command line sits above both and finds the benchmarks through an entry point, and the wheel holds only this project's
own top-level packages."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The HTTP layer and the benchmarks sit above the library; the library must work without them installed.
ABOVE_THE_LIBRARY = ("fastapi", "starlette", "uvicorn", "ragcache_server", "ragcache_cli", "ragcache_bench", "ragcache_testing")
# The top-level packages, lowest first: each may import only itself and those before it. The command line is the top
# floor (it starts the server); the benchmarks are a distribution of their own, which it finds through an entry point.
FLOORS_LOWEST_FIRST = ("ragcache", "ragcache_server", "ragcache_cli")


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
        for name in imported_modules(path):
            if name.split(".")[0] in ABOVE_THE_LIBRARY:
                offenders.append(f"{relative}: {name}")
    assert offenders == []


def test_each_floor_imports_only_itself_and_the_floors_below():
    offenders = []
    for position, floor in enumerate(FLOORS_LOWEST_FIRST):
        above = (*FLOORS_LOWEST_FIRST[position + 1 :], "ragcache_bench", "ragcache_testing")
        for path in sorted((ROOT / floor).rglob("*.py")):
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in imported_modules(path) if name.split(".")[0] in above]
    assert offenders == []


def test_the_shell_finds_bench_through_the_entry_point_the_benchmarks_declare():
    from ragcache_cli.cli import COMMANDS_GROUP, build_parser

    declared = tomllib.loads((ROOT / "benchmarks" / "pyproject.toml").read_text())["project"]["entry-points"][COMMANDS_GROUP]
    assert declared == {"bench": "ragcache_bench:add_bench_commands"}
    assert build_parser().parse_args(["bench", "levels"]).benchmarks == ["levels"]


def test_the_library_holds_no_benchmark_code():
    assert not (ROOT / "ragcache" / "bench").exists()
    assert (ROOT / "benchmarks" / "ragcache_bench" / "__init__.py").exists()


def test_the_wheel_installs_only_this_projects_own_top_level_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert included == ["ragcache*", "ragcache_server*", "ragcache_cli*"]
    top_level = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert top_level - {"tests"} == set(FLOORS_LOWEST_FIRST)


# The rooms of ragcache/, lowest first: a module may import only its own room and the rooms before it, so calls
# flow one way (the cache never calls up into retrieval, a level never into the facade). Lazy imports count too.
ROOMS_LOWEST_FIRST = (
    "errors", "observe", "settings", "storage", "core", "outbound", "engines", "tiers", "models",
    "retrieval", "rerank", "prefixes", "build", "deployment", "ray", "client", "integrations", "__init__", "app",
)
# The package root: the public __init__, the error tree, one cache from settings (build) and the whole assembly
# (deployment); settings is a room.
ROOT_MODULES = {"__init__.py", "errors.py", "build.py", "deployment.py"}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "ragcache":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_import_goes_to_the_same_room_or_a_lower_one():
    rank = {room: position for position, room in enumerate(ROOMS_LOWEST_FIRST)}
    upward = []
    for path in sorted((ROOT / "ragcache").rglob("*.py")):
        own = room_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        assert own in rank, f"{path}: a room not in ROOMS_LOWEST_FIRST"
        for name in imported_modules(path):
            target = room_of(name)
            if target is not None and rank[target] > rank[own]:
                upward.append(f"{path.relative_to(ROOT)} ({own}) imports {name} ({target})")
    assert upward == []


def test_the_package_root_holds_only_the_entry_points():
    assert {path.name for path in (ROOT / "ragcache").glob("*.py")} <= ROOT_MODULES


def test_the_http_client_imports_neither_torch_nor_milvus():
    # Apps that only talk to the service over HTTP import ragcache.client; it must stay light.
    check = "import sys, ragcache.client; print(sorted({'torch', 'pymilvus', 'fastapi'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


MAX_MODULE_LINES = 450  # one concern per module: past this, a module holds several


def test_no_module_of_the_library_the_service_or_the_benchmarks_is_over_the_bound():
    long = []
    for package in ("ragcache", "ragcache_server", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            num_lines = len(path.read_text().splitlines())
            if num_lines > MAX_MODULE_LINES:
                long.append(f"{path.relative_to(ROOT)}: {num_lines} lines")
    assert long == []


def public_packages() -> list[str]:
    """``ragcache`` and its room packages: the library's public surface, each with an explicit ``__all__``."""
    rooms = sorted(path.parent.name for path in (ROOT / "ragcache").glob("*/__init__.py"))
    return ["ragcache", *(f"ragcache.{room}" for room in rooms)]


def library_imports(package: str) -> list[tuple[str, str, str | None]]:
    """(file, module, name) of every import of the library in ``package``; the name is None for ``import ...``."""
    found: list[tuple[str, str, str | None]] = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(relative, alias.name, None) for alias in node.names if alias.name.split(".")[0] == "ragcache"]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ragcache":
                found += [(relative, node.module, alias.name) for alias in node.names]
    return found


def test_every_public_package_declares_its_names_and_each_resolves():
    unresolved = []
    for package in public_packages():
        module = importlib.import_module(package)
        assert isinstance(getattr(module, "__all__", None), list), f"{package} has no __all__"
        unresolved += [f"{package}.{name}" for name in module.__all__ if not hasattr(module, name)]
    assert unresolved == []


def test_the_service_imports_the_library_only_through_its_public_surface():
    # The HTTP app adapts the library to HTTP: it names ragcache or a room package, never a module inside a room,
    # and only names that package exports, so a room's modules can move or split without touching the service.
    public = {package: importlib.import_module(package).__all__ for package in public_packages()}
    offenders = []
    for relative, module, name in library_imports("ragcache_server"):
        if module not in public:
            offenders.append(f"{relative}: {module} is not ragcache or a room package")
        elif name is not None and name not in public[module]:
            offenders.append(f"{relative}: {name} is not in {module}.__all__")
    assert offenders == []


def module_imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (a room) and the modules of the same room it imports, relative or absolute, lazy or
    for type checking only."""
    folder = ROOT / package.replace(".", "/")
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        own = f"{package}.{path.stem}"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets |= {f"{package}.{node.module}"} if node.module else {f"{package}.{a.name}" for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{package}."):
                targets.add(node.module)
        graph[own] = {target for target in targets if target != own and target != f"{package}.__init__"}
    return graph


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (the modules along it), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (circle := visit(target)):
                return circle
        state[module] = 2
        path.pop()
        return []

    for module in sorted(graph):
        if module not in state and (circle := visit(module)):
            return circle
    return []


def test_the_prefix_registry_and_the_engine_adapters_hold_no_import_circle():
    # Issue 41 item 2: allow.py <-> config.py was one (the URL rule now lives in ragcache.outbound).
    assert import_circle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    for package in ("ragcache.prefixes", "ragcache.engines"):
        assert import_circle(module_imports(package)) == []


def test_the_engine_adapters_know_nothing_of_the_prefix_registry():
    # An adapter speaks its engine's protocol only (docs/DESIGN.md): no import of the registry, lazy or typed.
    names = [name for path in sorted((ROOT / "ragcache" / "engines").glob("*.py")) for name in imported_modules(path)]
    assert [name for name in names if name.startswith("ragcache.prefixes")] == []


MAX_CLASS_LINES = 250  # issue 41: a class past this in the registry or the adapter room does several jobs


def test_no_class_of_the_prefix_registry_or_the_engine_adapters_is_over_the_bound():
    long = []
    for room in ("prefixes", "engines"):
        for path in sorted((ROOT / "ragcache" / room).glob("*.py")):
            classes = [node for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.ClassDef)]
            for node in classes:
                num_lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if num_lines > MAX_CLASS_LINES:
                    long.append(f"{path.relative_to(ROOT)}: {node.name}, {num_lines} lines")
    assert long == []
