"""Remote models as configured: one ``RemoteModel`` per entry of the models list, and its embedding space.

The list comes from ``RAGCACHE_MODELS_FILE`` (JSON or TOML) and/or ``RAGCACHE_MODELS`` (the same list as
JSON text), as ``{"models": [{...}, ...]}``::

    [[models]]
    name = "openai-small"                  # what clients send as "model"
    provider = "openai"                    # openai | tei | ollama
    base_url = "https://api.openai.com/v1"
    upstream_model = "text-embedding-3-small"
    dimensions = 1536
    api_key_env = "OPENAI_API_KEY"         # or api_key_file = "/run/secrets/openai"
    price_per_million_tokens = 0.02

A credential is only ever named here (an environment variable or a file), read when the encoder is made,
and held outside this dataclass: a ``RemoteModel`` can be logged, shown and compared freely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import urlsplit

from ragcache.core.keys import DTYPES, EmbeddingSpace
from ragcache.errors import ConfigError
from ragcache.settings.files import load_file, load_json

__all__ = ["PROVIDERS", "RemoteModel", "load_models", "parse_models", "remote_space", "endpoint_identity"]

PROVIDERS = ("openai", "tei", "ollama")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}")


@dataclass(frozen=True)
class RemoteModel:
    """One remote embedding model as configured (no secret in here: only where to read it)."""

    name: str  # what clients call it by ("model" in /embed, /v1/embeddings, /documents, /search)
    provider: str  # one of PROVIDERS
    base_url: str  # e.g. https://api.openai.com/v1 (openai), http://tei:8080 (tei), http://ollama:11434 (ollama)
    upstream_model: str  # the model id the upstream knows (sent as "model"; TEI serves one model and ignores it)
    dimensions: int  # the length of the vectors it returns (part of the space; checked on every answer)
    api_key_env: str | None = None  # the environment variable holding the key, or
    api_key_file: str | None = None  # a file holding it (e.g. a mounted secret)
    revision: str = "unversioned"  # a label the operator changes when the upstream's model changes
    normalize: bool = False  # the upstream's vectors are unit length (TEI: asked for; others: as they come)
    send_dimensions: bool = False  # openai: send "dimensions" (text-embedding-3 shortens vectors on request)
    prompt: str | None = None  # prepended to every text by ragcache before sending (e.g. "query: ")
    prompt_name: str | None = None  # tei: a prompt the server has configured by name
    truncate: bool = True  # tei/ollama: let the upstream truncate over-long texts instead of refusing them
    endpoint_id: str | None = None  # the endpoint's identity in the space; default: from base_url
    max_inputs: int = 64  # most texts in one upstream request
    max_tokens: int = 16384  # most tokens (counted or estimated) in one upstream request
    max_input_tokens: int = 512  # most tokens of one text the model takes (the space's max_seq_length)
    tokenizer: str | None = None  # a local tokenizer (path or cached name) to count tokens; else an estimate
    concurrency: int = 4  # most requests in flight to this upstream at once
    timeout_s: float = 30.0  # one upstream call, retries and back-off included
    connect_timeout_s: float = 5.0  # establishing a connection (within timeout_s)
    max_retries: int = 3  # tries after the first, on 429, 5xx, refused or dropped connections
    retry_backoff_s: float = 0.25  # first back-off; doubled per retry, with full jitter, up to 8 s
    price_per_million_tokens: float | None = None  # what the upstream bills, for "money saved" in /stats
    dtype: str = "float32"  # how ragcache stores the vectors (part of the space)
    pass_through_auth: bool = False  # forward the caller's own provider key upstream (docs/providers.md)

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ConfigError(f"models: name {self.name!r} must be 1-128 letters, digits or ._:/@- (first a letter or digit)")
        if self.provider not in PROVIDERS:
            raise ConfigError(f"{where}: provider must be one of {PROVIDERS}, got {self.provider!r}")
        split = urlsplit(self.base_url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ConfigError(f"{where}: base_url must be an http:// or https:// URL, got {endpoint_identity(self.base_url)!r}")
        if split.username or split.password:
            raise ConfigError(f"{where}: base_url must not hold credentials; name them in api_key_env or api_key_file")
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ConfigError(f"{where}: give api_key_env or api_key_file, not both")
        if self.dtype not in DTYPES:
            raise ConfigError(f"{where}: dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.prompt_name is not None and self.provider != "tei":
            raise ConfigError(f"{where}: prompt_name is a TEI option; use prompt for {self.provider}")
        for name in ("dimensions", "max_inputs", "max_tokens", "max_input_tokens", "concurrency"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ConfigError(f"{where}: {name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("timeout_s", "connect_timeout_s", "retry_backoff_s"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) <= 0:
                raise ConfigError(f"{where}: {name} must be a positive number of seconds, got {getattr(self, name)!r}")
        if not isinstance(self.max_retries, int) or not 0 <= self.max_retries <= 10:
            raise ConfigError(f"{where}: max_retries must be an integer from 0 to 10, got {self.max_retries!r}")
        if self.price_per_million_tokens is not None and self.price_per_million_tokens < 0:
            raise ConfigError(f"{where}: price_per_million_tokens must not be negative")

    @property
    def endpoint(self) -> str:
        """The endpoint's identity in the space: ``endpoint_id``, else scheme://host:port/path of base_url."""
        return self.endpoint_id or endpoint_identity(self.base_url)


def endpoint_identity(url: str) -> str:
    """scheme://host:port/path of ``url``: the port made explicit, no credentials, query or fragment, no
    trailing slash; what tells two deployments apart (and what errors and /stats may show of a URL)."""
    split = urlsplit(url)
    try:
        port = split.port or {"http": 80, "https": 443}.get(split.scheme, 0)
    except ValueError:
        port = 0
    host = split.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6
    return f"{split.scheme}://{host}:{port}{split.path.rstrip('/')}"


def remote_space(model: RemoteModel) -> EmbeddingSpace:
    """The embedding space of a remote model: everything that can change the vector it returns.

    The one place that builds it, so that what a space covers is decided here (and extended here)."""
    return EmbeddingSpace(
        model=model.upstream_model,
        revision=model.revision,
        dtype=model.dtype,
        dim=model.dimensions,
        normalize=model.normalize,
        max_seq_length=model.max_input_tokens,
        prompt=model.prompt,
        provider=model.provider,
        endpoint=model.endpoint,
        prompt_name=model.prompt_name,
    )


def load_models(models_json: str | None, models_file: Path | None) -> list[RemoteModel]:
    """The configured remote models: those of ``models_json`` (JSON text), then of ``models_file``."""
    models: list[RemoteModel] = []
    if models_json:
        models += parse_models(load_json(models_json, "RAGCACHE_MODELS"), "RAGCACHE_MODELS")
    if models_file:
        models += parse_models(load_file(Path(models_file), "the models file"), str(models_file))
    names = [model.name for model in models]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"model names must be unique; configured more than once: {duplicates}")
    return models


def parse_models(document: object, source: str) -> list[RemoteModel]:
    """Models from ``{"models": [{...}, ...]}``; unknown or missing fields are refused, naming them."""
    entries = document.get("models") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: expected an object with a list 'models'")
    return [_parse_model(entry, f"{source}: models[{index}]") for index, entry in enumerate(entries)]


_FIELDS = {f.name for f in fields(RemoteModel)}
_REQUIRED = ("name", "provider", "base_url", "upstream_model", "dimensions")


def _parse_model(entry: object, where: str) -> RemoteModel:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise ConfigError(f"{where} has unknown fields {sorted(unknown)}; known: {sorted(_FIELDS)}")
    missing = [name for name in _REQUIRED if name not in entry]
    if missing:
        raise ConfigError(f"{where} needs {missing}")
    try:
        return RemoteModel(**entry)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


