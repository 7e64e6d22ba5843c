"""The shell around the library: the ``ragcache`` command (``cli``), the stats view, the README's settings table
(``config_docs``), the Prometheus export (``metrics``) and the allocator tuning the service applies at start."""
