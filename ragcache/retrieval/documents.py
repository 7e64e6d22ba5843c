"""Documents of a knowledge base and the checks every input passes before it reaches Milvus.

Each check raises ``InvalidInputError`` naming the field the way the HTTP body spells it
(``documents[3].id``), so the service can hand the message straight back to the caller.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragcache.core.keys import identity_hash
from ragcache.errors import InvalidInputError, InvalidTextError

__all__ = [
    "Document",
    "FILTER_EXAMPLE",
    "MAX_ID_BYTES",
    "MAX_TEXT_BYTES",
    "COLLECTION_NAME_PATTERN",
    "MAX_COLLECTION_CHARS",
    "check_collection_name",
    "milvus_collection_name",
    "collection_name_from_milvus",
    "check_documents",
    "check_ids",
    "check_query",
    "check_top_k",
    "check_filter",
    "content_hash",
    "CONTENT_HASH_LENGTH",
]

# Milvus counts VARCHAR max_length in bytes (Milvus Lite does not enforce it; a server does), so the
# limits here are UTF-8 bytes too: a document that passes here is accepted by every Milvus deployment.
MAX_ID_BYTES = 512
MAX_TEXT_BYTES = 65535
MAX_FILTER_CHARS = 4096
# What a filter looks like, shown wherever one is refused (and in `ragcache search --help`): a document's own keys sit
# under metadata, its id is a field; a bare `topic == "db"` names a field the collection does not have.
FILTER_EXAMPLE = 'metadata["topic"] == "db" and metadata["year"] >= 2020, or id in ["a.md#0", "b.md#0"]'
MAX_COLLECTION_CHARS = 63
COLLECTION_NAME_PATTERN = re.compile(rf"[A-Za-z][A-Za-z0-9_-]{{0,{MAX_COLLECTION_CHARS - 1}}}")
MILVUS_PREFIX = "kb_"


CONTENT_HASH_LENGTH = 32


@dataclass(frozen=True)
class Document:
    """One document: a caller-chosen id (upserts replace by id), its text, and JSON metadata."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


def content_hash(document: Document) -> str:
    """BLAKE2b-128 (``identity_hash``) of the document's text and metadata (keys sorted, so key order does not count): equal hashes,
    equal stored rows, so a re-ingest can skip the document without embedding or writing it."""
    canonical = json.dumps([document.text, document.metadata], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return identity_hash(canonical.encode("utf-8"))


def check_collection_name(name: object) -> str:
    """The name unchanged when it is a valid collection name, else ``InvalidInputError``."""
    if not isinstance(name, str) or not COLLECTION_NAME_PATTERN.fullmatch(name):
        raise InvalidInputError(
            f"collection name {name!r} is invalid: use 1-{MAX_COLLECTION_CHARS} letters, digits, '_' or '-', starting with a letter",
            field="collection",
        )
    return name


def milvus_collection_name(name: str) -> str:
    """The Milvus name of a collection: ``kb_`` + the name with '_' as '__' and '-' as '_0'.

    Milvus allows only letters, digits and '_'. The escaping is reversible, so two user names never map
    to one Milvus collection ('a-b' -> 'kb_a_0b', 'a_b' -> 'kb_a__b'), and the ``kb_`` prefix keeps
    knowledge bases apart from the L3 cache collections (``rc_<space_id>``).
    """
    return MILVUS_PREFIX + check_collection_name(name).replace("_", "__").replace("-", "_0")


def collection_name_from_milvus(milvus_name: str) -> str | None:
    """The collection name a Milvus name was made from, or None when it was not made by
    ``milvus_collection_name``."""
    if not milvus_name.startswith(MILVUS_PREFIX):
        return None
    escaped, chars, position = milvus_name[len(MILVUS_PREFIX) :], [], 0
    while position < len(escaped):
        if escaped[position] == "_":
            chars.append("_" if escaped[position + 1 : position + 2] == "_" else "-")
            position += 2
        else:
            chars.append(escaped[position])
            position += 1
    name = "".join(chars)
    # The escaping is one-to-one, so a name that does not map back is a collection someone else made.
    if not COLLECTION_NAME_PATTERN.fullmatch(name) or milvus_collection_name(name) != milvus_name:
        return None
    return name


def _utf8_size(value: str, field_name: str, index: int = 0) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"{field_name} is not valid Unicode: {exc.reason} at character {exc.start}; "
            "lone surrogates cannot be encoded as UTF-8",
            index=index,
            field=field_name,
        ) from exc


def _check_id(value: object, field_name: str, index: int) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{field_name} must be a non-empty string", field=field_name)
    if _utf8_size(value, field_name, index) > MAX_ID_BYTES:
        raise InvalidInputError(f"{field_name} is longer than {MAX_ID_BYTES} UTF-8 bytes", field=field_name)
    return value


def _as_document(item: object, index: int) -> Document:
    if isinstance(item, Document):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - {"id", "text", "metadata"}
        if unknown:
            raise InvalidInputError(
                f"documents[{index}] has unknown fields {sorted(unknown)}; expected id, text, metadata",
                field=f"documents[{index}]",
            )
        metadata = item.get("metadata")
        return Document(id=item.get("id"), text=item.get("text"), metadata={} if metadata is None else metadata)  # type: ignore[arg-type]
    raise InvalidInputError(
        f"documents[{index}] is {type(item).__name__}, expected a Document or a mapping with id, text, metadata",
        field=f"documents[{index}]",
    )


def check_documents(documents: object) -> list[Document]:
    """Valid documents (``Document`` or mappings), in order; ids must be unique within the batch."""
    if isinstance(documents, (str, bytes, Mapping)) or not isinstance(documents, Sequence):
        raise InvalidInputError("documents must be a list", field="documents")
    if not documents:
        raise InvalidInputError("documents must not be empty", field="documents")
    checked: list[Document] = []
    id_to_index: dict[str, int] = {}
    for index, item in enumerate(documents):
        document = _as_document(item, index)
        doc_id = _check_id(document.id, f"documents[{index}].id", index)
        if doc_id in id_to_index:
            raise InvalidInputError(
                f"documents[{index}].id {doc_id!r} repeats documents[{id_to_index[doc_id]}].id; "
                "ids must be unique within one request",
                field=f"documents[{index}].id",
            )
        id_to_index[doc_id] = index
        text_field = f"documents[{index}].text"
        if not isinstance(document.text, str) or not document.text:
            raise InvalidInputError(f"{text_field} must be a non-empty string", field=text_field)
        if _utf8_size(document.text, text_field, index) > MAX_TEXT_BYTES:
            raise InvalidInputError(f"{text_field} is longer than {MAX_TEXT_BYTES} UTF-8 bytes", field=text_field)
        _check_metadata(document.metadata, f"documents[{index}].metadata")
        checked.append(document)
    return checked


def _check_metadata(metadata: object, field_name: str) -> None:
    if not isinstance(metadata, dict):
        raise InvalidInputError(f"{field_name} must be a JSON object", field=field_name)
    try:
        # Milvus stores the metadata as JSON; finding a value it cannot store here names the document.
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{field_name} is not valid JSON: {exc}", field=field_name) from exc
    _check_integers(metadata, field_name)


INT64_RANGE = range(-(1 << 63), 1 << 63)


def _check_integers(value: object, field_name: str) -> None:
    """Milvus' JSON field holds 64-bit integers only; a larger one would fail the whole batch inside Milvus."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and value not in INT64_RANGE:
        raise InvalidInputError(f"{field_name} holds {value}, outside the 64-bit integer range: send it as a string", field=field_name)
    if isinstance(value, dict):
        for item in value.values():
            _check_integers(item, field_name)
    elif isinstance(value, list):
        for item in value:
            _check_integers(item, field_name)


def check_ids(ids: object) -> list[str]:
    """Valid, distinct document ids, in order of first appearance."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidInputError("ids must be a list of strings", field="ids")
    if not ids:
        raise InvalidInputError("ids must not be empty", field="ids")
    # Deleting an id twice is harmless, so repeats are folded rather than rejected.
    return list(dict.fromkeys(_check_id(value, f"ids[{index}]", index) for index, value in enumerate(ids)))


def check_query(query: object) -> str:
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query must be a non-empty string", field="query")
    _utf8_size(query, "query")
    return query


def check_top_k(top_k: object, max_top_k: int) -> int:
    # bool is an int in Python; top_k=True is a mistake, not 1.
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= max_top_k:
        raise InvalidInputError(f"top_k must be an integer from 1 to {max_top_k}, got {top_k!r}", field="top_k")
    return top_k


def check_filter(expression: object) -> str | None:
    """None for no filter (None or blank); the expression otherwise. Its syntax is Milvus' to judge."""
    if expression is None:
        return None
    if not isinstance(expression, str):
        raise InvalidInputError(f"filter must be a string (a Milvus boolean expression, e.g. {FILTER_EXAMPLE})", field="filter")
    if len(expression) > MAX_FILTER_CHARS:
        raise InvalidInputError(f"filter is longer than {MAX_FILTER_CHARS} characters", field="filter")
    return expression.strip() or None
