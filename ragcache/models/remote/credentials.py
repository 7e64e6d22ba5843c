"""The upstream's key: read once, from the environment variable or file a model names, and never shown.

``ApiKey`` masks itself in ``repr`` and ``str`` (so a log line, a traceback's locals or an error message
that formats it shows ``ApiKey(****)``); only ``header()`` holds the real value, for the one request
header that needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ragcache.errors import ConfigError
from ragcache.models.remote.config import RemoteModel

__all__ = ["ApiKey", "read_api_key"]

MAX_KEY_FILE_BYTES = 64 * 1024


class ApiKey:
    """A secret that does not print."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def header(self) -> str:
        """The ``Authorization`` header value that carries it."""
        return f"Bearer {self._value}"

    def scrub(self, text: str) -> str:
        """``text`` with any copy of the key masked (an upstream's error message may echo it)."""
        return text.replace(self._value, "****") if self._value else text

    def __repr__(self) -> str:
        return "ApiKey(****)"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("an ApiKey is not pickled")


def read_api_key(model: RemoteModel, environ: Mapping[str, str]) -> ApiKey | None:
    """The key ``model`` names (None when it names none). A named variable or file that is missing or
    empty is a ``ConfigError`` that says where it looked, never what it found."""
    if model.api_key_env is not None:
        value = environ.get(model.api_key_env, "").strip()
        if not value:
            raise ConfigError(f"model {model.name!r}: the environment variable {model.api_key_env} (api_key_env) is unset or empty")
        return ApiKey(value)
    if model.api_key_file is not None:
        path = Path(model.api_key_file)
        try:
            if path.stat().st_size > MAX_KEY_FILE_BYTES:
                raise ConfigError(f"model {model.name!r}: the key file {path} is over {MAX_KEY_FILE_BYTES} bytes")
            value = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"model {model.name!r}: cannot read the key file {path} (api_key_file): {type(exc).__name__}") from None
        if not value:
            raise ConfigError(f"model {model.name!r}: the key file {path} (api_key_file) is empty")
        return ApiKey(value)
    return None
