"""Incremental ingest: which documents a sync leaves alone, replaces, adds and deletes.

Every stored document carries a content hash (``ragcache.retrieval.documents.content_hash``: its text and metadata).
An ingest compares the hashes of the documents it receives with the stored ones: an equal hash is skipped
(nothing embedded, nothing written), another hash replaces the document, an unknown id adds one. A sync's
cleanup then deletes what is gone from the source, as LangChain's indexing API does:

- ``incremental``: documents whose ``metadata["source"]`` is one of the sources in this request but whose id is
  not in it (the chunks a changed file no longer has). The request must hold every document of those sources.
- ``full``: every document of the collection (or of ``scope``, a filter expression) whose id is not in this
  request: for a source sent whole in one request. ``ragcache ingest --sync`` does the same across many
  requests by listing the collection's ids and deleting those no batch sent (``KnowledgeBase.list_ids``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ragcache.errors import InvalidInputError
from ragcache.retrieval.documents import Document, check_filter

__all__ = ["SyncOptions", "CLEANUPS", "source_expression", "sources_of", "MAX_LISTED_IDS"]

CLEANUPS = ("incremental", "full")
# Most ids one listing (a full cleanup, /documents/ids) may return: 1M ids of up to 512 bytes stay in memory.
MAX_LISTED_IDS = 1_000_000


@dataclass(frozen=True)
class SyncOptions:
    cleanup: Literal["incremental", "full"] = "incremental"
    scope: str | None = None  # full cleanup only: a filter expression limiting what may be deleted

    def __post_init__(self) -> None:
        if self.cleanup not in CLEANUPS:
            raise InvalidInputError(f"sync.cleanup must be one of {CLEANUPS}, got {self.cleanup!r}", field="sync.cleanup")
        if self.scope is not None and self.cleanup != "full":
            raise InvalidInputError("sync.scope limits a full cleanup; an incremental one is scoped by source", field="sync.scope")
        try:
            object.__setattr__(self, "scope", check_filter(self.scope))
        except InvalidInputError as exc:
            raise InvalidInputError(str(exc).replace("filter", "sync.scope", 1), field="sync.scope") from exc


def sources_of(documents: Sequence[Document]) -> list[str]:
    """The distinct string ``metadata["source"]`` values of the documents, sorted."""
    return sorted({source for document in documents if isinstance(source := document.metadata.get("source"), str)})


def source_expression(sources: Sequence[str]) -> str:
    """A Milvus expression matching documents of these sources. JSON string literals are Milvus string
    literals (the same escapes), so a quote or backslash in a file name cannot break out of the list."""
    return f'metadata["source"] in {json.dumps(list(sources), ensure_ascii=True)}'
