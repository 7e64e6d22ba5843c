"""What the library shows of itself: spans (``tracing``), progress bars on stderr (``progress``) and the masking
that keeps secrets out of every log line, error and repr (``redact``). Kept import-light: the HTTP client uses it."""
