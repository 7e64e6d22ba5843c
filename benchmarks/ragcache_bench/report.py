"""Figures, targets and verdicts; the printed table and the JSON result file.

A benchmark returns a ``BenchResult``: named figures (a value with its unit), some with a ``Target`` that
decides PASS or MISS, plus free-form ``details`` (raw samples, configuration) that go to JSON only.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Target", "Figure", "BenchResult", "command_line", "format_table", "interleaved", "machine_info",
    "markdown_from_json", "median", "measure", "plausible", "summary_line", "write_json",
]

PASS = "PASS"
MISS = "MISS"


@dataclass(frozen=True)
class Target:
    """``value <op> threshold``, e.g. ``Target(">=", 100)`` for "at least 100x"."""

    op: str
    threshold: float

    def __post_init__(self) -> None:
        if self.op not in (">=", "<=", "=="):
            raise ValueError(f"unknown target operator {self.op!r}")

    def met_by(self, value: float, tolerance: float = 1e-9) -> bool:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return False
        if self.op == ">=":
            return value >= self.threshold - tolerance
        if self.op == "<=":
            return value <= self.threshold + tolerance
        return abs(value - self.threshold) <= tolerance

    def describe(self, unit: str = "") -> str:
        return f"{self.op} {self.threshold:g}{unit}"


@dataclass(frozen=True)
class Figure:
    """One reported number. ``target`` set: it is judged; ``goal`` names the issue's target (e.g. "1").

    ``requires`` are the conditions the number means something under (every text computed, all from L1, the
    result cache hit...), each a name and whether it held. A figure with one is judged even without a target,
    and any condition that did not hold makes it a MISS: a figure measured on the wrong path never passes.
    """

    name: str
    value: float | int | str | None
    unit: str = ""
    target: Target | None = None
    goal: str = ""
    note: str = ""
    requires: tuple[tuple[str, bool], ...] = ()

    @property
    def failed_requirements(self) -> list[str]:
        return [name for name, held in self.requires if not held]

    @property
    def verdict(self) -> str:
        if self.target is None and not self.requires:
            return ""
        if self.failed_requirements:
            return MISS
        if self.target is None:
            return PASS
        # bool is an int: a precondition's True must never pass for a number.
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            return MISS
        return PASS if self.target.met_by(self.value) else MISS

    def to_dict(self) -> dict:
        data = asdict(self)
        data["target"] = None if self.target is None else self.target.describe(f" {self.unit}" if self.unit else "")
        data["requires"] = {name: held for name, held in self.requires}
        data["verdict"] = self.verdict or None
        return data

    def annotated_note(self) -> str:
        """The note, led by the conditions that failed (the reason for a MISS a reader must see first)."""
        failed = self.failed_requirements
        if not failed:
            return self.note
        return "; ".join(["precondition failed: " + ", ".join(failed), self.note]).rstrip("; ")


@dataclass
class BenchResult:
    name: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    seconds: float = 0.0

    def add(
        self,
        name: str,
        value,
        unit: str = "",
        *,
        target: Target | None = None,
        goal: str = "",
        note: str = "",
        requires: dict[str, bool] | None = None,
    ) -> Figure:
        figure = Figure(name, value, unit, target, goal, note, tuple((k, bool(v)) for k, v in (requires or {}).items()))
        self.figures.append(figure)
        return figure

    def crashed(self, exc: BaseException) -> Figure:
        """A benchmark that raised: one figure that is always a MISS, naming the error."""
        return self.add("crashed", f"{type(exc).__name__}: {exc}"[:200], requires={"the benchmark ran to the end": False})

    @property
    def num_missed(self) -> int:
        return self.verdicts.count(MISS)

    @property
    def verdicts(self) -> list[str]:
        return [figure.verdict for figure in self.figures if figure.verdict]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "seconds": round(self.seconds, 2),
            "figures": [figure.to_dict() for figure in self.figures],
            "details": self.details,
        }


def plausible(ratio: float, limit: float) -> dict[str, bool]:
    """The precondition that a speed-up stays physically possible (``ratio <= limit``). Above it the run measured
    the machine's load, not the system: a MISS named "noisy run", never a PASS."""
    return {f"plausible, at most {limit:g}x (above: a noisy run)": ratio <= limit}


def _format_number(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "nan"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude == 0:
        return "0"
    return f"{value:.4f}" if magnitude >= 0.001 else f"{value:.2e}"


def format_table(results: Sequence[BenchResult]) -> str:
    """One aligned table: benchmark, figure, value, target, verdict (and a note where one was given)."""
    header = ("bench", "goal", "figure", "value", "target", "verdict", "note")
    rows = [header]
    for result in results:
        for figure in result.figures:
            rows.append(
                (
                    result.name,
                    figure.goal,
                    figure.name,
                    _format_number(figure.value) + (f" {figure.unit}" if figure.unit else ""),
                    figure.target.describe(figure.unit and f" {figure.unit}") if figure.target else "",
                    figure.verdict,
                    figure.annotated_note(),
                )
            )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.ljust(width) if column != 3 else cell.rjust(width) for column, (cell, width) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths) + "  ----")
    return "\n".join(lines)


def summary_line(results: Sequence[BenchResult]) -> str:
    verdicts = [verdict for result in results for verdict in result.verdicts]
    return f"{verdicts.count(PASS)} PASS, {verdicts.count(MISS)} MISS of {len(verdicts)} targets"


def machine_info() -> dict:
    """Where the figures came from: enough to judge whether two runs compare."""
    import numpy
    import torch

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        with open("/proc/cpuinfo") as file:
            info["cpu_model"] = next((line.split(":", 1)[1].strip() for line in file if line.startswith("model name")), None)
        with open("/proc/meminfo") as file:
            info["mem_total_gib"] = round(int(file.readline().split()[1]) / 2**20, 1)
        info["load_avg"] = os.getloadavg()
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def command_line(name: str) -> str:
    """The command as typed, in its ``ragcache bench <name>`` form (for the JSON)."""
    argv = sys.argv[sys.argv.index(name) + 1:] if name in sys.argv else sys.argv[1:]
    return " ".join(["ragcache", "bench", name, *argv])


def write_json(path: Path, payload: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    return path


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def measure(fn: Callable[[], object], *, repeats: int, warmup: int = 1, before: Callable[[], object] | None = None) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` (after ``warmup`` unrecorded ones). ``before`` runs
    ahead of every call, untimed (e.g. to empty a level so each call sees the same state)."""
    samples = []
    for index in range(warmup + repeats):
        if before is not None:
            before()
        started = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - started
        if index >= warmup:
            samples.append(elapsed)
    return samples


def interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int = 1,
    before: dict[str, Callable[[], object]] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each function, measured side by side: every round calls each function once (in
    an order that rotates by round, so none is always first after a pause). Medians of these compare
    systems under the same background load, which on a shared machine drifts within seconds."""
    before = before or {}
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if name in before:
                before[name]()
            started = time.perf_counter()
            fns[name]()
            elapsed = time.perf_counter() - started
            if round_index >= warmup:
                samples[name].append(elapsed)
    return samples


def markdown_from_json(payload: dict) -> str:
    """The figures of an ``all.json`` (or one benchmark's JSON) as a Markdown table, for docs/benchmarks.md and benchmarks/notes/."""
    results = payload.get("results") or [payload["result"]]
    lines = ["| bench | goal | figure | value | target | verdict | note |", "|---|---|---|---|---|---|---|"]
    for result in results:
        for figure in result["figures"]:
            value = _format_number(figure["value"]) + (f" {figure['unit']}" if figure["unit"] else "")
            cells = [result["name"], figure["goal"], figure["name"], value, figure["target"] or "",
                     f"**{figure['verdict']}**" if figure["verdict"] else "", _note_of(figure)]
            lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def _note_of(figure: dict) -> str:
    failed = [name for name, held in (figure.get("requires") or {}).items() if not held]
    return "; ".join(filter(None, ["precondition failed: " + ", ".join(failed) if failed else "", figure["note"]]))


if __name__ == "__main__":  # python -m ragcache_bench.report bench-results/all.json > table.md
    print(markdown_from_json(json.loads(Path(sys.argv[1]).read_text())))
