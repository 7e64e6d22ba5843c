"""Whose request, under which prompt: the one way to select the keys a request reads and writes in its model's cache.

One ``EmbeddingCache`` (one set of levels, one batcher, one compute thread) serves every scope of its model. A
scope changes the request's space, so its keys: a tenant's (``tenant_cache_namespaces``) entries never serve
another tenant, and a named prompt's (``ragcache.models.prompts``) vectors are the model's under that prompt.
The batcher gives the model one prompt per batch. Space ids are unchanged: a tenant is the space's
``namespace`` and a prompt its ``prompt``, exactly as the per-tenant and per-prompt caches set them before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ragcache.core.keys import EmbeddingSpace

__all__ = ["TOKEN_IDS", "Prompt", "Scope", "token_ids_of", "token_ids_text"]


@dataclass(frozen=True)
class Prompt:
    """A model's named prompt: the text put before each input (``name`` is how requests ask for it)."""

    name: str
    text: str


@dataclass(frozen=True)
class Scope:
    """A request's tenant (None: the shared keys) and prompt (None: the model's own space)."""

    tenant: str | None = None
    prompt: Prompt | None = None

    @property
    def prompt_text(self) -> str | None:
        """The text the model is given this scope's inputs under (None: the model's own, a default prompt included)."""
        return self.prompt.text if self.prompt is not None else None

    def space_of(self, space: EmbeddingSpace) -> EmbeddingSpace:
        """The model's ``space`` as this scope sees it."""
        if self.tenant is None and self.prompt is None:
            return space
        changes: dict[str, str] = {}
        if self.tenant is not None:
            changes["namespace"] = self.tenant
        if self.prompt is not None:
            changes["prompt"] = self.prompt.text
        return dataclasses.replace(space, **changes)  # type: ignore[arg-type]


UNSCOPED = Scope()

# Token ids for a model that takes them as they are (``Capabilities.takes_token_ids``: a remote model whose upstream
# reads ids). They walk the cache as texts, one id list written as its ids in decimal joined by spaces, under this
# prompt, which the cache puts before each on a miss. Its text is a lone surrogate, which no caller's text can hold
# (its UTF-8 hash refuses it: a 422), so the ids' keys sit in a space of their own (the prompt is part of the space
# id: "101 2023" as text never meets [101, 2023]) and no caller's text can reach a model as if it were ids.
TOKEN_IDS = Prompt("token_ids", "\ud800")


def token_ids_text(ids: list[int]) -> str:
    """The text an id list walks the cache as, under ``TOKEN_IDS``."""
    return " ".join(map(str, ids))


def token_ids_of(model_input: str) -> list[int] | None:
    """The ids of a model input made under ``TOKEN_IDS`` (its text, then the ids' text); None for any other input."""
    if not model_input.startswith(TOKEN_IDS.text):
        return None
    return [int(part) for part in model_input[len(TOKEN_IDS.text):].split()]
