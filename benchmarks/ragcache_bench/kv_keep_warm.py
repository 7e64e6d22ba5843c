"""``bench kv``'s keep-warm: the prefix registry in a process of its own, pinned or unpinned between blocks.

A command the process does not answer is reported with its cause (issue 42: two ``--chat-prefix`` runs stopped on
"did not answer" and nothing said why): a command that raised comes back as its traceback, a process that died as
its exit code, and one that hangs has every thread's stack dumped (``faulthandler``) into the error.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import multiprocessing
import os
import signal
import tempfile
import time
import traceback
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PrefixSpec

__all__ = ["KeepWarm", "KeepWarmProcessError", "registry_config"]

# How long a pin or unpin may take: a registration that warms waits for one warm (request_timeout_s, 30 s) at most.
ANSWER_TIMEOUT_S = 120.0
# How long the process may take to start (importing transformers and torch for the local tokenizer among it).
START_TIMEOUT_S = 300.0


class KeepWarmProcessError(RuntimeError):
    """The keep-warm registry process did not do what it was asked; the message says why."""


def _registry_process(connection: Connection, config: PrefixRegistryConfig, spec: PrefixSpec,
                      extras: tuple[PrefixSpec, ...] = (), stacks_path: str | None = None) -> None:
    """The keep-warm registry in a process of its own, as in a deployment (it lives in the ragcache service, not
    in the users' clients): its loop then never holds the GIL of the process that times TTFT. Commands: True
    (keep warm) or False (stop warming; the learned schedule is kept), None (stop: answers the stats). Each is
    answered True, or with the traceback of what it raised. SIGUSR1 dumps every thread's stack to ``stacks_path``.
    ``extras`` are registered as given for the whole run (``bench kv --chat-prefix``: an idle chat prefix)."""
    stacks = open(stacks_path, "w") if stacks_path else None  # noqa: SIM115 - open for the process's lifetime
    if stacks is not None:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    # The registry counts a prefix's tokens with the model's local tokenizer (ragcache.prefixes.tokens), and its first
    # registration imports transformers and torch for it: in a service they are imported already, here they are not,
    # and under the bench's churn on two cores that import took over 120 s (a pin "did not answer"; the stacks showed
    # torch's import). Imported now, before the bench's first block, which waits for this process to be ready.
    import transformers.models.auto.tokenization_auto  # noqa: F401
    with httpx.Client(timeout=config.request_timeout_s) as http:
        registry = PrefixRegistry.create(config, http=http)
        try:
            registry.start()
            for extra in extras:
                registry.register(extra)
        except Exception:  # noqa: BLE001 - sent to the bench, which stops with it
            connection.send(traceback.format_exc())
            registry.close()
            return
        connection.send(True)  # ready
        try:
            while (command := connection.recv()) is not None:
                if stacks is not None:
                    # Besides SIGUSR1 (which came back empty from a hung pin): faulthandler's own watchdog thread
                    # writes every stack if the command is still running shortly before the bench gives up on it.
                    faulthandler.dump_traceback_later(ANSWER_TIMEOUT_S * 0.75, file=stacks)
                try:
                    registry.register(dataclasses.replace(spec, pinned=command))
                except Exception:  # noqa: BLE001 - the bench stops with this traceback instead of a silent timeout
                    connection.send(traceback.format_exc())
                    continue
                finally:
                    faulthandler.cancel_dump_traceback_later()
                connection.send(True)
            stats = registry.stats()
            connection.send({"num_warms_sent": stats.num_warms_sent, "num_warms_deferred": stats.num_warms_deferred,
                             "num_warms_held_busy": stats.num_warms_held_busy,
                             "num_warms_avoided": stats.num_warms_avoided,
                             "warm_budget_per_minute": stats.warm_budget_per_minute,  # as sized at the end (None: fixed)
                             "prefix": asdict(registry.prefix_stats(spec.name)),
                             "extras": {e.name: asdict(registry.prefix_stats(e.name)) for e in extras}})
        finally:
            registry.close()


class KeepWarm:
    """Drives :func:`_registry_process`: pin or unpin the system prompt between blocks."""

    def __init__(self, config: PrefixRegistryConfig, spec: PrefixSpec, extras: tuple[PrefixSpec, ...] = (), *,
                 answer_timeout_s: float = ANSWER_TIMEOUT_S) -> None:
        context = multiprocessing.get_context("spawn")
        self._answer_timeout_s = answer_timeout_s
        self._stacks_path = Path(tempfile.mkdtemp()) / "stacks.txt"
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_registry_process, args=(child, config, spec, extras,
                                                                         str(self._stacks_path)), daemon=True)
        self._process.start()
        child.close()  # the child's end lives in the child only: its death reads here as EOF, not as silence
        self.stats: dict[str, Any] = {}
        self._failed = True  # until it answers that it is ready: close() kills it instead of asking it for stats
        ready = self._answer("start", START_TIMEOUT_S)
        if ready is not True:
            raise KeepWarmProcessError(f"the keep-warm registry process failed to start:\n{ready}")
        self._failed = False

    def set(self, on: bool) -> None:
        what = "pin" if on else "unpin"
        try:
            self._connection.send(on)
        except OSError:
            pass  # it died: what it sent before (the traceback of its start) or EOF is read next
        self._failed = True  # until it answers
        answer = self._answer(what)
        self._failed = False
        if answer is not True:
            raise KeepWarmProcessError(f"the keep-warm registry process failed a {what}:\n{answer}")

    def _answer(self, what: str, timeout_s: float | None = None) -> Any:
        """The process's answer to the command just sent, or an error that says why none came."""
        timeout_s = self._answer_timeout_s if timeout_s is None else timeout_s
        try:
            if self._connection.poll(timeout_s):
                return self._connection.recv()
        except (EOFError, OSError):
            raise KeepWarmProcessError(f"the keep-warm registry process died ({self._exit()}) during a {what}") from None
        if not self._process.is_alive():
            raise KeepWarmProcessError(f"the keep-warm registry process died ({self._exit()}) during a {what}")
        assert self._process.pid is not None
        os.kill(self._process.pid, signal.SIGUSR1)
        time.sleep(1.0)  # faulthandler writes from a signal handler: give it a moment
        stacks = self._stacks_path.read_text(errors="replace") if self._stacks_path.exists() else ""
        raise KeepWarmProcessError(f"the keep-warm registry process did not answer a {what} within "
                                   f"{timeout_s:.0f}s; it is alive, and its threads were:\n{stacks}")

    def _exit(self) -> str:
        self._process.join(timeout=5)
        return f"exit code {self._process.exitcode}"

    def close(self) -> None:
        if self._failed:
            self._process.kill()
        elif self._process.is_alive():
            try:
                self._connection.send(None)
                if self._connection.poll(60):
                    self.stats = self._connection.recv()
            except (EOFError, OSError):
                pass  # it died meanwhile: no stats, as when it does not answer
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
        if kind is None or not any(t in kind for t in ("int", "float", "bool")):
            raise SystemExit(f"--registry-setting {setting!r}: not a numeric or true/false field of PrefixRegistryConfig")
        if "bool" in kind:
            if value.lower() not in ("true", "false"):
                raise SystemExit(f"--registry-setting {setting!r}: {name} is true or false")
            changes[name] = value.lower() == "true"
        else:
            changes[name] = None if value.lower() == "none" else (float(value) if "float" in kind else int(value))
    return PrefixRegistryConfig(file_path=Path(tempfile.mkdtemp()) / "prefixes.json", default_block_size=block_size,
                                **changes)
