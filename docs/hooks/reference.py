"""MkDocs hook: the reference pages generated from the code at every build, so they cannot drift from it.

- ``reference/cli.md``: every ``ragcache`` command and option, from the argument parser itself;
- ``reference/http.md``: every route, from the app's own OpenAPI schema (built without starting anything);
- ``reference/python.md``: the public names of ``ragcache`` and ``ragcache.client``, rendered by mkdocstrings
  from wherever each one is defined now (a moved class moves its page entry with it).

The settings table is generated too, but committed (docs/configuration.md, checked by tests/app/test_readme.py),
so that it reads on a forge without a build.
"""

from __future__ import annotations

import argparse
import importlib
import json

from mkdocs.structure.files import File

PAGES = ("reference/cli.md", "reference/http.md", "reference/python.md")


def on_files(files, config):
    for path, render in zip(PAGES, (cli_page, http_page, python_page), strict=True):
        files.append(File.generated(config, path, content=render()))
    return files


def _cell(text: object) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def cli_page() -> str:
    from ragcache_cli.cli import build_parser

    parser = build_parser()
    lines = ["# Command line", "", "Generated from `ragcache`'s argument parser at build time. From a checkout, run it",
             "as `.venv/bin/ragcache` (or activate the environment: `. .venv/bin/activate`).", "",
             "```text", parser.format_help().rstrip(), "```"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                lines += ["", f"## `ragcache {name}`", "", "```text", sub.format_help().rstrip(), "```"]
                for inner in sub._actions:  # `bench` has commands of its own
                    if isinstance(inner, argparse._SubParsersAction):
                        for inner_name in inner.choices:
                            lines.append(f"- `ragcache {name} {inner_name}`: "
                                         f"`ragcache {name} {inner_name} --help` for its options")
    return "\n".join(lines) + "\n"


def http_page() -> str:
    from ragcache.settings import Settings
    from ragcache_server.app import create_app

    schema = create_app(Settings(redis_url="off", milvus_uri="off")).openapi()
    lines = ["# HTTP API reference", "",
             f"Generated from the service's OpenAPI schema ({schema['info']['title']} {schema['info']['version']}) at",
             "build time; a running service serves the same schema at `/openapi.json` and an interactive page at",
             "`/docs`. What each route does, with examples: [the HTTP API guide](../http-api.md).", "",
             "| method | path | summary | request body |", "|---|---|---|---|"]
    for path, operations in sorted(schema["paths"].items()):
        for method, operation in operations.items():
            body = (operation.get("requestBody") or {}).get("content", {})
            refs = sorted({(media.get("schema") or {}).get("$ref", "").rsplit("/", 1)[-1] or media_type
                           for media_type, media in body.items()})
            lines.append(f"| `{method.upper()}` | `{path}` | {_cell(operation.get('summary'))} | "
                         f"{', '.join(f'`{ref}`' for ref in refs if ref)} |")
    lines += ["", "## Schemas", ""]
    for name, model in sorted(schema.get("components", {}).get("schemas", {}).items()):
        lines += [f"### `{name}`", ""]
        if model.get("description"):
            lines += [_cell(model["description"]), ""]
        properties = model.get("properties") or {}
        if properties:
            required = set(model.get("required") or [])
            lines += ["| field | type | required | description |", "|---|---|---|---|"]
            for field, spec in properties.items():
                kind = spec.get("type") or spec.get("$ref", "").rsplit("/", 1)[-1] or json.dumps(
                    [option.get("type") or option.get("$ref", "").rsplit("/", 1)[-1] for option in spec.get("anyOf", [])])
                lines.append(f"| `{field}` | {_cell(kind)} | {'yes' if field in required else ''} | "
                             f"{_cell(spec.get('description'))} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def python_page() -> str:
    lines = ["# Python API", "", "Generated from the code's docstrings at build time. `import ragcache` gives the",
             "in-process cache; `ragcache.client` talks to a running service and needs neither torch nor pymilvus.", ""]
    shown: set[str] = set()
    for package in ("ragcache", "ragcache.client"):
        module = importlib.import_module(package)
        lines += [f"## `{package}`", ""]
        for name in getattr(module, "__all__", []):
            defined = getattr(module, name)
            home = getattr(defined, "__module__", None)
            # Errors get one section of their own below; an alias (SearchResponse) is shown under its real name.
            if home is None or not home.startswith("ragcache") or home == "ragcache.errors":
                continue
            target = f"{home}.{defined.__qualname__}"
            if target in shown:
                continue
            shown.add(target)
            lines += [f"::: {target}", "    options:", "      heading_level: 3", ""]
    lines += ["## Errors", "", "::: ragcache.errors", "    options:", "      heading_level: 3", "      show_root_heading: false", ""]
    return "\n".join(lines) + "\n"
