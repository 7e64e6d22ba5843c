"""The shell over everything: the ``ragcache`` command (``cli``), the stats view (``stats_view``) and the README's
settings table (``config_docs``).

It sits above the library and the HTTP service (it starts the service, and talks to one through the library's
client); nothing below imports it. ``ragcache bench`` is not imported from here: a distribution adds commands
through the ``ragcache.commands`` entry-point group (the benchmarks distribution declares ``bench``).
"""

from __future__ import annotations

from ragcache_cli.cli import main

__all__ = ["main"]
