"""Configuration documents (API keys, remote models) read as JSON text or as a JSON or TOML file, every failure a
``ConfigError`` naming its source."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from ragcache.errors import ConfigError

__all__ = ["load_json", "load_file"]


def load_json(text: str, source: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc}") from exc


def load_file(path: Path, what: str) -> object:
    """A ``.toml`` file as TOML, any other as JSON; ``what`` names it in errors (e.g. "the API key file")."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    if path.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return load_json(text, str(path))
