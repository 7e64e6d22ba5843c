"""Where the CPU of L1-hit traffic goes with Milvus Lite in the process tree (issue 28, item 2).

The service in front of the instant upstream: 3,840 new texts (misses), then 7,680 L1 hits, CPU per process of
the service's tree during the hits, then 5 s idle; first with every computed vector written to L3
(RAGCACHE_L3_ADMISSION=all, the old default), then with the disk level and reuse-only admission (the new
default).

    .venv/bin/python benchmarks/scripts/milvus_cpu_after_writes.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from ragcache_bench.overhead import _block, _hit_block, _Texts
from ragcache_testing.instant import InstantUpstream
from ragcache_testing.service import ServiceProcess

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_by_process(root: int) -> dict[int, tuple[str, float]]:
    """(name, user + system CPU seconds) of ``root`` and every live descendant."""
    found: dict[int, tuple[int, str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat.split("(", 1)[1].rsplit(")", 1)[0]
        fields = stat.rsplit(")", 1)[1].split()
        found[int(entry.name)] = (int(fields[1]), name, (int(fields[11]) + int(fields[12])) / TICKS)
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _, _) in found.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return {pid: found[pid][1:] for pid in tree if pid in found}


def spent(before: dict, after: dict) -> dict[str, float]:
    return {name: round(cpu - before.get(pid, (name, 0.0))[1], 2) for pid, (name, cpu) in after.items()}


def main() -> None:
    work = Path(tempfile.mkdtemp())
    texts = _Texts()
    with InstantUpstream() as upstream:
        for label, env in [("admission all (old default)", {"RAGCACHE_L3_ADMISSION": "all"}),
                           ("disk + admission on reuse (new default)", {"RAGCACHE_DISK_PATH": str(work / "disk")})]:
            service = ServiceProcess(work / label.split()[0], redis_url=None, extra_env={
                "RAGCACHE_MODELS_JSON": upstream.models_json, "RAGCACHE_MODEL": upstream.model,
                "RAGCACHE_DRIFT_CHECK": "false", **env})
            try:
                _block(service.url + "/v1", texts.bodies(120, upstream.model, "base64"), None)
                before = cpu_by_process(service.process.pid)
                hits = _hit_block(upstream, service, "base64", 240)
                during = cpu_by_process(service.process.pid)
                time.sleep(5)
                idle = cpu_by_process(service.process.pid)
                print(f"{label}: {hits.cpu_ms_per_text:.4f} ms CPU per L1 hit; CPU s during {hits.texts:,} hits "
                      f"{spent(before, during)}; idle 5 s {spent(during, idle)}")
            finally:
                service.stop()


if __name__ == "__main__":
    main()
