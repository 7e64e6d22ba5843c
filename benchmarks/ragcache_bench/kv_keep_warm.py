"""``bench kv``'s keep-warm: the prefix registry in a process of its own, pinned or unpinned between blocks."""

from __future__ import annotations

import dataclasses
import multiprocessing
import tempfile
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PrefixSpec

__all__ = ["KeepWarm", "registry_config"]


def _registry_process(connection: Connection, config: PrefixRegistryConfig, spec: PrefixSpec,
                      extras: tuple[PrefixSpec, ...] = ()) -> None:
    """The keep-warm registry in a process of its own, as in a deployment (it lives in the ragcache service, not
    in the users' clients): its loop then never holds the GIL of the process that times TTFT. Commands: True
    (keep warm) or False (stop warming; the learned schedule is kept), None (stop: answers the stats).
    ``extras`` are registered as given for the whole run (``bench kv --chat-prefix``: an idle chat prefix)."""
    with httpx.Client(timeout=config.request_timeout_s) as http:
        registry = PrefixRegistry.create(config, http=http)
        registry.start()
        for extra in extras:
            registry.register(extra)
        try:
            while (command := connection.recv()) is not None:
                registry.register(dataclasses.replace(spec, pinned=command))
                connection.send(True)
            stats = registry.stats()
            connection.send({"num_warms_sent": stats.num_warms_sent, "num_warms_deferred": stats.num_warms_deferred,
                             "num_warms_held_busy": stats.num_warms_held_busy,
                             "num_warms_avoided": stats.num_warms_avoided,
                             "prefix": asdict(registry.prefix_stats(spec.name)),
                             "extras": {e.name: asdict(registry.prefix_stats(e.name)) for e in extras}})
        finally:
            registry.close()


class KeepWarm:
    """Drives :func:`_registry_process`: pin or unpin the system prompt between blocks."""

    def __init__(self, config: PrefixRegistryConfig, spec: PrefixSpec, extras: tuple[PrefixSpec, ...] = ()) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_registry_process, args=(child, config, spec, extras), daemon=True)
        self._process.start()
        self.stats: dict[str, Any] = {}

    def set(self, on: bool) -> None:
        self._connection.send(on)
        if not self._connection.poll(120) or self._connection.recv() is not True:
            raise RuntimeError("the keep-warm registry process did not answer")

    def close(self) -> None:
        if self._process.is_alive():
            self._connection.send(None)
            if self._connection.poll(60):
                self.stats = self._connection.recv()
        self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()


def registry_config(block_size: int, settings: list[str]) -> PrefixRegistryConfig:
    """The registry's defaults (a file store in a temporary folder, the server's block size), changed only by
    ``settings`` (``name=value``; ``none`` for None)."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(PrefixRegistryConfig)}
    changes: dict[str, Any] = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        kind = fields.get(name)
        if kind is None or not any(t in kind for t in ("int", "float")):
            raise SystemExit(f"--registry-setting {setting!r}: not a numeric field of PrefixRegistryConfig")
        changes[name] = None if value.lower() == "none" else (float(value) if "float" in kind else int(value))
    return PrefixRegistryConfig(file_path=Path(tempfile.mkdtemp()) / "prefixes.json", default_block_size=block_size,
                                **changes)
