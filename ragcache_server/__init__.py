"""The HTTP service: adapts the ragcache library to HTTP and nothing more."""
