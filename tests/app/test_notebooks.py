"""notebooks/: each notebook executes top to bottom (nbclient) and shows what it promises; git holds them
without outputs.

The kernel is this test run's own interpreter (a kernelspec written for the test whose argv is
``sys.executable``), so a user-level ``python3`` kernelspec pointing elsewhere cannot change what runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
KERNEL_NAME = "ragcache-tests"
CELL_TIMEOUT_S = 900  # generous: the machine may be busy; the notebooks take about a minute when it is not


@pytest.fixture(scope="module")
def kernel_dirs(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("kernels")
    spec = folder / KERNEL_NAME
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "ragcache tests", "language": "python"}))
    return [str(folder)]


def execute(name: str, kernel_dirs: list[str]) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=KernelSpecManager(kernel_dirs=kernel_dirs))
    NotebookClient(notebook, km=manager, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(ROOT)}}).execute()
    return notebook


def stream_text(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream" and output.name == "stdout")


def summary_of(notebook) -> str:
    cells = [cell for cell in notebook.cells if "summary" in cell.metadata.get("tags", [])]
    assert len(cells) == 1, "each notebook has one cell tagged 'summary'"
    return stream_text(cells[0])


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return float(match.group(1))


def test_committed_notebooks_have_no_outputs():
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert {path.name for path in paths} == {"cache_levels.ipynb", "rag_client.ipynb"}
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
        for cell in notebook.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, \
                    f"{path.name}: outputs committed (run scripts/strip_notebooks.py)"


def test_kernel_is_this_interpreter(kernel_dirs, tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys; print(sys.executable)")])
    path = tmp_path / "which.ipynb"
    nbformat.write(notebook, path)
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=KernelSpecManager(kernel_dirs=kernel_dirs))
    NotebookClient(notebook, km=manager, timeout=CELL_TIMEOUT_S).execute()
    assert stream_text(notebook.cells[0]).strip() == sys.executable


def test_cache_levels_notebook(kernel_dirs):
    notebook = execute("cache_levels.ipynb", kernel_dirs)
    summary = summary_of(notebook)
    hit_rate = number(r"stream hit rate ([0-9.]+)", summary)
    ideal = number(r"never forgets: ([0-9.]+)", summary)
    assert 0.5 < hit_rate <= ideal  # no cache beats one that never forgets
    for level in ("L1", "L2", "L3"):
        assert number(rf"{level} (\d+)", summary) > 0, f"{level} served nothing: {summary}"
    assert number(r"computed (\d+)", summary) > 0
    assert number(r"compute saved ([0-9.]+) s", summary) > 0
    images = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3  # hit rate over time, latency by level, compute saved


def test_rag_client_notebook(kernel_dirs):
    notebook = execute("rag_client.ipynb", kernel_dirs)
    summary = summary_of(notebook)
    assert number(r"questions (\d+)", summary) == 6
    assert number(r"result cache hits (\d+)", summary) == 3  # the three repeated questions
    assert "after an ingest: result cache miss, vector from L1" in summary
    assert "prompts on the prefix 6/6" in summary
    assert number(r"service hit rate ([0-9.]+)", summary) > 0


def test_strip_script_gives_back_the_committed_notebook(kernel_dirs, tmp_path):
    # Run a notebook, strip it with the script a contributor uses before committing: byte for byte the original.
    notebook = nbformat.read(NOTEBOOKS / "rag_client.ipynb", as_version=4)
    executed = tmp_path / "executed.ipynb"
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=KernelSpecManager(kernel_dirs=kernel_dirs))
    notebook.cells = notebook.cells[:1] + [nbformat.v4.new_code_cell("print(40 + 2)")]
    NotebookClient(notebook, km=manager, timeout=CELL_TIMEOUT_S).execute()
    nbformat.write(notebook, executed)
    assert json.loads(executed.read_text())["cells"][1]["outputs"], "the execution wrote outputs"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "strip_notebooks.py"), str(executed)], check=True, timeout=120)
    expected = nbformat.read(NOTEBOOKS / "rag_client.ipynb", as_version=4)
    expected.cells = expected.cells[:1] + [nbformat.v4.new_code_cell("print(40 + 2)")]
    expected.cells[1].id = notebook.cells[1].id
    assert executed.read_text() == nbformat.writes(expected) + "\n"
