"""Strip what running a notebook adds, so that git holds notebooks exactly as written.

    .venv/bin/python scripts/strip_notebooks.py notebooks/*.ipynb

Removes outputs, execution counts, per-cell execution timings and the kernel's version details; the
notebooks' test fails when a committed notebook still carries any of them.
"""

from __future__ import annotations

import sys

import nbformat


def strip(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook without anything an execution wrote into it (changed in place, and returned)."""
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    language = notebook.metadata.get("language_info", {}).get("name")
    if language:
        notebook.metadata["language_info"] = {"name": language}
    notebook.metadata.pop("widgets", None)
    return notebook


def main(paths: list[str]) -> int:
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        before = nbformat.writes(notebook)
        after = nbformat.writes(strip(notebook))
        if after != before:
            nbformat.write(notebook, path)  # as the notebooks were written: nbformat's layout, a final newline
            print(f"stripped {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
