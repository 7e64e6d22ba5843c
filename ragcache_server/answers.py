"""The byte bound of answers that carry documents (``max_answer_bytes``), and search hits without their text.

A search answer is mostly its hits' texts: 32 queries x 200 hits over 60 KB documents made a 357 MB answer
(+1.1 GB of service memory), and at the request limits one key could ask for ~16 GB. The hits are measured
as they are counted, before anything is serialised, and an answer over the bound is a 413 that names the
setting and says how to ask for less.

A search that could pass the bound (its hits times the largest document text) does not even read the texts
with the hits: Milvus answers ids, scores and metadata, and the texts are read afterwards by id, each distinct
document once, a batch at a time, until the bound is spent (``fill_texts``). So the refusal costs at most the
bound plus one batch of memory, not the whole answer first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from ragcache.retrieval import MAX_TEXT_BYTES, CollectionName, Document, KnowledgeBase, SearchResult, in_order_asked
from ragcache_server.errors import HTTPError

__all__ = ["SEARCH_ADVICE", "DOCUMENTS_ADVICE", "check_answer_bytes", "documents_within", "fill_texts", "hit_bytes",
           "may_pass", "without_texts"]

# A hit's JSON beyond its id, text and metadata: the keys, the score and the punctuation.
HIT_OVERHEAD_BYTES = 64
SEARCH_ADVICE = "ask for fewer queries or a smaller top_k, or for hits without their text (include_text: false)"
DOCUMENTS_ADVICE = "ask for fewer ids at a time"


class Item(Protocol):
    """A search hit or a document: what an answer carries of it (read-only, as the frozen dataclasses are)."""

    @property
    def id(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def metadata(self) -> dict[str, Any]: ...


def hit_bytes(item: Item, *, include_text: bool = True) -> int:
    """About the bytes ``item`` adds to a JSON answer (exact for the text and metadata, which dominate)."""
    size = HIT_OVERHEAD_BYTES + len(item.id) + (len(orjson.dumps(item.metadata)) if item.metadata else 2)
    if include_text:
        # str.isascii() is a flag lookup: only non-ASCII texts are encoded to be measured.
        size += len(item.text) if item.text.isascii() else len(item.text.encode("utf-8", "surrogatepass"))
    return size


def check_answer_bytes(items: Iterable[Item], max_bytes: int, *, include_text: bool = True, advice: str, used: int = 0) -> int:
    """The estimated size of an answer carrying ``items`` after ``used`` bytes of it; a 413 as soon as the running
    total passes ``max_bytes`` (the rest is not measured)."""
    total = used
    for count, item in enumerate(items, 1):
        total += hit_bytes(item, include_text=include_text)
        if total > max_bytes:
            message = (f"the answer would be over this server's limit of {max_bytes} bytes (RAGCACHE_MAX_ANSWER_BYTES) "
                       f"at item {count} of it: {advice}")
            raise HTTPError(413, message, type="answer_too_large")
    return total


def without_texts(result: SearchResult) -> dict[str, Any]:
    """``result`` as its JSON object, each hit without its ``text`` key (the rest as the dataclass has it)."""
    answer = {field.name: getattr(result, field.name) for field in dataclasses.fields(result)}
    answer["hits"] = [{"id": hit.id, "score": hit.score, "metadata": hit.metadata} for hit in result.hits]
    return answer


def may_pass(num_hits: int, max_bytes: int) -> bool:
    """Whether ``num_hits`` hits of the largest texts a collection holds could pass ``max_bytes``."""
    return num_hits * (MAX_TEXT_BYTES + HIT_OVERHEAD_BYTES) > max_bytes


def fill_texts(knowledge: KnowledgeBase, collection: CollectionName, results: list[SearchResult], max_bytes: int) -> list[SearchResult]:
    """``results`` (searched without their texts) with each hit's text, read by id a batch at a time; a 413 as soon
    as the distinct texts alone pass ``max_bytes`` (the answer holds each at least once). A document deleted
    since the search answers an empty text."""
    ids = list(dict.fromkeys(hit.id for result in results for hit in result.hits))
    texts: dict[str, str] = {}
    used = 0
    if ids:
        for batch in knowledge.document_batches(collection, ids):
            used = check_answer_bytes(batch, max_bytes, advice=SEARCH_ADVICE, used=used)
            texts.update((document.id, document.text) for document in batch)
    return [dataclasses.replace(result, hits=tuple(dataclasses.replace(hit, text=texts.get(hit.id, "")) for hit in result.hits))
            for result in results]


def documents_within(knowledge: KnowledgeBase, collection: CollectionName, ids: list[str], max_bytes: int) -> list[Document]:
    """``KnowledgeBase.get_documents`` read a batch at a time, with a 413 as soon as the answer passes ``max_bytes``."""
    documents: list[Document] = []
    used = 0
    for batch in knowledge.document_batches(collection, ids):
        used = check_answer_bytes(batch, max_bytes, advice=DOCUMENTS_ADVICE, used=used)
        documents.extend(batch)
    return in_order_asked(ids, documents)
