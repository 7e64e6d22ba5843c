"""Benchmarks of ragcache as a library, each against the systems it must beat, measured in one process.

Each function takes the shared ``BenchContext`` and returns a ``BenchResult``; the figures that answer the
issue's targets carry that target and its number (``goal``).

The benchmarks live one family to a module; this module is the name the ``ragcache bench`` registry imports:

- :mod:`ragcache_bench.library_l2`: ``bench l2`` (target 3);
- :mod:`ragcache_bench.library_misses`: ``bench misses`` (target 4), ``bench concurrency`` (target 6);
- :mod:`ragcache_bench.library_zipf`: ``bench zipf`` (target 5, the stream race, hit rates against exact LRU);
- :mod:`ragcache_bench.library_scale`: ``bench scale`` (target 7).
"""

from __future__ import annotations

from ragcache_bench.library_l2 import bench_l2
from ragcache_bench.library_misses import bench_concurrency, bench_misses
from ragcache_bench.library_scale import bench_scale
from ragcache_bench.library_zipf import bench_zipf

__all__ = ["bench_l2", "bench_misses", "bench_zipf", "bench_concurrency", "bench_scale"]
