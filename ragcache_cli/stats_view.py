"""The service's ``/stats`` as a terminal table, once (``ragcache stats``) or live (``ragcache stats --watch``).

The table is rendered from the JSON the service answers, so it shows what any client sees. Watching adds
one column: each level's hit rate over the last refresh interval, from the difference between two answers
(the since-start counters only ever grow, so the difference is exactly what happened in between).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["render_stats", "watch_stats"]

CLEAR_SCREEN = "\x1b[H\x1b[2J"


def render_stats(stats: dict[str, Any], previous: dict[str, Any] | None = None, interval_s: float | None = None) -> str:
    """Per model: totals since start, then one row per level. ``previous`` (an earlier answer, ``interval_s``
    before) adds the hit rate of each level over that interval; ``-`` where nothing was looked up."""
    lines: list[str] = []
    for model, entry in stats["models"].items():
        overall = entry["since_start"]
        before = _levels_of(previous, model)
        lines.append(f"{model}  (space {entry['space']['space_id']})")
        last = f"last {interval_s:g}s" if interval_s else "last"
        totals = (f"  texts {overall['texts']:,}  hit rate {overall['hit_rate']:.3f}  computed {overall['texts_computed']:,}  "
                  f"compute saved {overall['compute_s_saved']:.1f} s")
        if previous is not None:
            earlier = previous["models"].get(model, {}).get("since_start")
            rate = _interval_rate(_as_level(overall), _as_level(earlier))
            totals += f"  |  {last}: {_interval_texts(overall, earlier)} texts, hit rate {rate}"
        lines.append(totals)
        header = f"  {'level':<6}{'up':<5}{'lookups':>10}{'hits':>10}{'misses':>10}{'errors':>8}{'hit rate':>10}{'served':>9}"
        lines.append(header + (f"{last:>12}" if previous is not None else "") + f"{'p50 ms':>9}{'p99 ms':>9}")
        for level in overall["levels"]:
            name = level["level"]
            up = "yes" if entry["levels"].get(name, {}).get("up", True) else "NO"
            served = level["hits"] / overall["texts"] if overall["texts"] else 0.0
            row = (f"  {name:<6}{up:<5}{level['lookups']:>10,}{level['hits']:>10,}{level['misses']:>10,}{level['errors']:>8,}"
                   f"{level['hit_rate']:>10.3f}{served:>9.1%}")
            if previous is not None:
                row += f"{_interval_rate(level, before.get(name)):>12}"
            lines.append(row + f"{level['latency_p50_ms']:>9.3f}{level['latency_p99_ms']:>9.3f}")
            causes = [f"{cause.replace('_', ' ')} {count:,}" for cause, count in level.get("misses_by_cause", {}).items() if count]
            if causes:
                lines.append(f"  {'':<6}misses: " + ", ".join(causes))
            admission = _admission_line(entry["levels"].get(name, {}))
            if admission:
                lines.append(admission)
        if "upstream" in entry:
            lines += _upstream_lines(entry["upstream"])
        if entry.get("drift"):
            lines.append(_drift_line(entry["drift"]))
    return "\n".join(lines)


def _admission_line(state: dict[str, Any]) -> str | None:
    """A level that admits only some vectors (L3 on reuse): its rule, what it took and what it declined."""
    if "admission" not in state:
        return None
    return f"  {'':<6}admission {state['admission']}: admitted {state['num_admitted']:,}, declined {state['num_declined']:,}"


def _drift_line(drift: dict[str, Any]) -> str:
    """The model's drift check (docs/drift.md): status, generation in use, events, the last distance."""
    distance = "-" if drift["last_distance"] is None else f"{drift['last_distance']:.2g}"
    line = (f"  drift {drift['status']}  generation {drift['generation']}  events {drift['num_drift_events']:,}  "
            f"checks {drift['num_checks']:,} (failed {drift['num_check_errors']:,})  "
            f"canary distance {distance} (tolerance {drift['tolerance']:g})")
    return line + (f"  last error: {drift['last_error']}" if drift["last_error"] else "")


def _upstream_lines(upstream: dict[str, Any]) -> list[str]:
    """A remote model's upstream: what was sent, what failed, how fast, and what the cache saved."""
    errors = ", ".join(f"{kind} {count:,}" for kind, count in sorted(upstream["errors"].items())) or "none"
    money = upstream.get("money_saved")
    saved = f"  saved: {upstream['texts_saved']:,} texts, {upstream['tokens_saved']:,} tokens"
    if money is not None:
        saved += f", {money:.4f} money"
    state = "up" if upstream["up"] else "DOWN"
    return [
        f"  upstream {upstream['provider']} {upstream['endpoint']}  {state}  calls {upstream['num_calls']:,}  "
        f"texts {upstream['num_texts']:,}  tokens {upstream['num_tokens']:,} ({upstream['token_counting']})",
        f"  upstream retries {upstream['num_retries']:,}  errors {errors}  latency p50/p95/p99 "
        f"{upstream['latency_p50_ms']:.1f}/{upstream['latency_p95_ms']:.1f}/{upstream['latency_p99_ms']:.1f} ms" + saved,
    ]


def watch_stats(
    fetch: Callable[[], dict[str, Any]],
    *,
    interval_s: float,
    count: int | None,
    out: TextIO,
    title: str = "",
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Fetch and render every ``interval_s`` seconds, ``count`` times (forever when None); returns how many
    tables were shown. The screen is cleared between tables only when ``out`` is a terminal."""
    clear = out.isatty()
    previous = None
    shown = 0
    while count is None or shown < count:
        if shown:
            sleep(interval_s)
        current = fetch()
        stamp = time.strftime("%H:%M:%S")
        out.write((CLEAR_SCREEN if clear else "") + f"{title}  {stamp}  (every {interval_s:g} s; Ctrl-C stops)\n")
        out.write(render_stats(current, previous, interval_s if previous is not None else None) + "\n\n")
        out.flush()
        previous = current
        shown += 1
    return shown


def _levels_of(stats: dict[str, Any] | None, model: str) -> dict[str, dict[str, Any]]:
    if stats is None or model not in stats["models"]:
        return {}
    return {level["level"]: level for level in stats["models"][model]["since_start"]["levels"]}


def _as_level(overall: dict[str, Any] | None) -> dict[str, Any] | None:
    """The whole cache's counters in a level's terms: every text asked for is a lookup."""
    return None if overall is None else {"hits": overall["hits"], "lookups": overall["texts"]}


def _interval_texts(overall: dict[str, Any], before: dict[str, Any] | None) -> str:
    texts = overall["texts"] - (before["texts"] if before else 0)
    return f"{texts:,}" if texts >= 0 else "-"  # negative: the service restarted in between


def _interval_rate(level: dict[str, Any] | None, before: dict[str, Any] | None) -> str:
    level, before = level or {"hits": 0, "lookups": 0}, before or {"hits": 0, "lookups": 0}
    lookups = level["lookups"] - before["lookups"]
    if lookups <= 0:
        return "-"
    return f"{(level['hits'] - before['hits']) / lookups:.3f}"
