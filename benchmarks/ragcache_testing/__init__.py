"""Process launchers the tests and the benchmarks share: the service (one process or replicas), Infinity and
vLLM servers. Not part of the ragcache library: nothing under ``ragcache/`` imports this package."""
