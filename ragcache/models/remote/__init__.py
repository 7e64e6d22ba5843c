"""Remote embedding models behind the cache: one ``Encoder`` per provider, all sharing ``RemoteEncoder``.

    openai   any OpenAI-compatible POST /embeddings (OpenAI, vLLM, Infinity, TEI's and Ollama's /v1)
    tei      text-embeddings-inference's native POST /embed
    ollama   Ollama's native POST /api/embed

``open_remote_encoder(model, environ)`` makes the encoder a configured ``RemoteModel`` names, with its key
read from the variable or file the model names.
"""

from __future__ import annotations

from collections.abc import Mapping

from ragcache.models.remote.config import PROVIDERS, RemoteModel, endpoint_identity, load_models, parse_models, remote_space
from ragcache.models.remote.credentials import ApiKey, read_api_key
from ragcache.models.remote.http import RemoteEncoder
from ragcache.models.remote.ollama import OllamaEncoder
from ragcache.models.remote.openai import OpenAIEncoder
from ragcache.models.remote.stats import UpstreamSavings, UpstreamStats, savings
from ragcache.models.remote.tei import TEIEncoder

__all__ = [
    "PROVIDERS",
    "ApiKey",
    "OllamaEncoder",
    "OpenAIEncoder",
    "RemoteEncoder",
    "RemoteModel",
    "TEIEncoder",
    "UpstreamSavings",
    "UpstreamStats",
    "endpoint_identity",
    "load_models",
    "open_remote_encoder",
    "parse_models",
    "read_api_key",
    "remote_space",
    "savings",
]

ENCODER_CLASSES: dict[str, type[RemoteEncoder]] = {"openai": OpenAIEncoder, "tei": TEIEncoder, "ollama": OllamaEncoder}


def open_remote_encoder(model: RemoteModel, environ: Mapping[str, str], **options) -> RemoteEncoder:
    """The encoder of ``model``, its key read now (``options`` go to ``RemoteEncoder``: the test seams)."""
    return ENCODER_CLASSES[model.provider](model, api_key=read_api_key(model, environ), **options)
