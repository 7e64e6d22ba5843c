"""The runtime helpers a process serving the library applies: the Prometheus export (``metrics``) and the process
tuning at start (the allocator, torch's threads). The command line sits above the service, in ``ragcache_cli``.

Each name is imported on first use, so the command starts without loading torch (``metrics`` does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache.observe.exports import lazy_exports

_EXPORTS = {
    ".metrics": ("CacheCollector", "DriftCollector", "ServerRestartsCollector"),
    ".allocator": ("retain_freed_memory",),
    ".torch_threads": ("torch_threads",),
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ragcache.app.allocator import retain_freed_memory
    from ragcache.app.metrics import CacheCollector, DriftCollector, ServerRestartsCollector
    from ragcache.app.torch_threads import torch_threads
