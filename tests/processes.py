"""The processes a test looks for: by the files they use, or by parent and name (read from /proc)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["children_named", "processes_using", "unix_sockets_of"]


def _processes() -> dict[int, tuple[str, int, str, str]]:
    """pid -> (name, parent pid, state, command line and working folder) of every process this user may read,
    zombies left out. The working folder, since redis-server rewrites its command line (its title) but works in its
    ``--dir``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cmdline += " cwd=" + os.readlink(entry / "cwd")
        except OSError:
            continue  # exited meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if state != "Z":
            found[int(entry.name)] = (name, int(ppid), state, cmdline)
    return found


def processes_using(path: Path) -> dict[int, str]:
    """pid -> command line of every live process whose command line or working folder names ``path`` (or a path
    under it)."""
    needle = str(Path(path).resolve())
    return {pid: cmdline for pid, (_, _, _, cmdline) in _processes().items()
            if needle in cmdline or str(path) in cmdline}


def children_named(name: str, parent: int | None = None) -> set[int]:
    """The live child processes of ``parent`` (default: this process) called ``name``."""
    parent = os.getpid() if parent is None else parent
    return {pid for pid, (comm, ppid, _, _) in _processes().items() if ppid == parent and comm == name}


def unix_sockets_of(pid: int) -> list[str]:
    """The paths of the unix sockets process ``pid`` has open (its descriptors' inodes, named in /proc/net/unix)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    paths = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes:
            paths.append(fields[7])
    return paths
