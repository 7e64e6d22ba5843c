#!/usr/bin/env python3
"""The peak memory of a process tree: every second, the resident memory of ``ROOT_PID`` and all its descendants
(pytest, the Redis and Milvus Lite servers it starts, a vLLM server, Ray's workers), summed; the largest sum seen
is written to ``OUT_FILE`` (bytes, and the time and the processes of that moment) each time it grows.

    .ci/peak_rss.py ROOT_PID OUT_FILE          sample until ROOT_PID exits (or this is stopped)
    .ci/peak_rss.py --report OUT_FILE BOUND_GIB  print the peak; exit 1 when it is over BOUND_GIB

Started in the background by ``.ci/run``, which stops it at the end, prints the peak and fails when it is over the
bound in the README's test section. The standard library only (``/proc``): it runs before any environment exists.
RSS counts pages shared between processes once per process, so the sum can only overstate the tree's use.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
POLL_S = 1.0


def children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name is in parentheses and may hold spaces: the fields after its last ")" are plain.
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def tree_of(root: int) -> list[int]:
    tree, found, todo = children_by_parent(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, ()))
    return found


def rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def name_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def main(root: int, out: Path) -> None:
    me, peak = os.getpid(), -1
    while Path(f"/proc/{root}").exists():
        pids = [pid for pid in tree_of(root) if pid != me]
        sizes = {pid: rss_bytes(pid) for pid in pids}
        total = sum(sizes.values())
        if total > peak:
            peak = total
            largest = sorted(sizes.items(), key=lambda item: -item[1])[:8]
            record = {"peak_bytes": peak, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "num_processes": len(pids),
                      "largest": [{"pid": pid, "name": name_of(pid), "rss_bytes": size} for pid, size in largest]}
            partial = out.with_name(out.name + ".partial")
            partial.write_text(json.dumps(record, indent=1))
            partial.replace(out)  # whole or not at all, whenever .ci/run reads it
        time.sleep(POLL_S)


def report(out: Path, bound_gib: float) -> int:
    """Print the peak in ``out`` beside ``bound_gib``; 1 when over it (0 when nothing was sampled: said so)."""
    if not out.exists() or not out.stat().st_size:
        print("ci: no peak memory was sampled")
        return 0
    record = json.loads(out.read_text())
    peak_gib = record["peak_bytes"] / 2**30
    largest = ", ".join(f"{p['name']} {p['rss_bytes'] / 2**30:.2f} GiB" for p in record["largest"][:5])
    print(f"ci: peak memory of the run (its process tree's RSS, sampled every second): {peak_gib:.2f} GiB, "
          f"bound {bound_gib:g} GiB (README.md)")
    print(f"ci:   at {record['at']}, {record['num_processes']} processes; the largest: {largest}")
    if peak_gib > bound_gib:
        print(f"ci: the peak memory, {peak_gib:.2f} GiB, is over the README's bound of {bound_gib:g} GiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--report":
        sys.exit(report(Path(sys.argv[2]), float(sys.argv[3])))
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(int(sys.argv[1]), Path(sys.argv[2]))
