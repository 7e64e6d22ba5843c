"""Named prompts per model: the instructions that retrieval models want before a query or a document.

Models such as E5 (``"query: "`` / ``"passage: "``), BGE (a query instruction, nothing before documents) and
GTE or nomic-embed (``"search_query: "`` / ``"search_document: "``) embed a query and a document differently;
without their prompts, retrieval quality drops. sentence-transformers names such prompts in a model's
``prompts`` (``config_sentence_transformers.json``) and applies one with ``encode(..., prompt_name=...)``;
text-embeddings-inference takes ``prompt_name`` in ``/embed``.

A model's known prompts are its own (non-empty ones) overlaid with those configured for it
(``RAGCACHE_MODEL_PROMPTS``). A prompt is part of the embedding space (``EmbeddingSpace.prompt`` holds its
text), so a text embedded under two prompts has two keys. A request names its prompt in its scope
(``ragcache.core.scope``): one cache per model serves every prompt, its batcher giving the model one prompt per
batch (``ragcache.core.misses`` applies it). A model with no known prompts behaves exactly as before: no space id
changes.
"""

from __future__ import annotations

from collections.abc import Mapping

from ragcache.core.encoder import capabilities_of
from ragcache.errors import InvalidInputError

__all__ = ["QUERY", "DOCUMENT", "INPUT_TYPES", "known_prompts", "prompt_name_of"]

# The names the retrieval routes use: /search embeds queries under QUERY, /documents documents under DOCUMENT
# (each only when the model has a prompt of that name).
QUERY = "query"
DOCUMENT = "document"
# ``input_type`` as Voyage (query/document) and Cohere (search_query/search_document) clients send it.
INPUT_TYPES = {"query": QUERY, "document": DOCUMENT, "search_query": QUERY, "search_document": DOCUMENT}


def known_prompts(encoder: object, configured: Mapping[str, str] | None) -> dict[str, str]:
    """The model's own named prompts (empty ones left out: they change nothing), overlaid with the
    configured ones."""
    own = capabilities_of(encoder).prompts
    prompts = {name: text for name, text in own.items() if isinstance(text, str) and text}
    prompts.update(configured or {})
    return prompts


def prompt_name_of(prompt_name: str | None, input_type: str | None) -> str | None:
    """The prompt name a request asks for: ``prompt_name``, or the one its ``input_type`` stands for."""
    if input_type is not None and input_type not in INPUT_TYPES:
        raise InvalidInputError(
            f"input_type must be one of {', '.join(INPUT_TYPES)}; got {input_type!r}", field="input_type"
        )
    implied = None if input_type is None else INPUT_TYPES[input_type]
    if prompt_name is not None and implied is not None and prompt_name != implied:
        raise InvalidInputError(
            f"prompt_name {prompt_name!r} contradicts input_type {input_type!r}: send one of them", field="prompt_name"
        )
    return prompt_name if prompt_name is not None else implied
