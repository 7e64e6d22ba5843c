"""Prompt text: the constant head of a template, rendering prefix-first, and volatile-content checks."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ragcache.errors import InvalidInputError

from .model import Prefix, VolatileSpan

__all__ = ["Chunk", "assemble_prompt", "template_head", "template_slots", "render_text", "render_messages",
           "find_volatile"]

_FORMATTER = string.Formatter()


def _parse(template: str) -> list[tuple[str, str | None, str | None, str | None]]:
    try:
        return list(_FORMATTER.parse(template))
    except ValueError as exc:  # unbalanced braces
        raise InvalidInputError(f"template does not parse: {exc}", field="text") from exc


def template_head(text: str, is_template: bool) -> str:
    """The constant text before the first slot: the part every rendered prompt starts with.

    ``{{`` and ``}}`` in a template's head stand for literal braces, so the head is unescaped exactly as
    ``str.format`` would do it; a plain system prompt is its own head, braces and all.
    """
    if not is_template:
        return text
    head = []
    for literal, field, _spec, _conv in _parse(text):
        head.append(literal)
        if field is not None:
            break
    return "".join(head)


def template_slots(text: str) -> tuple[str, ...]:
    """Names of the slots of a template, in order of first appearance."""
    names: list[str] = []
    for _literal, field, _spec, _conv in _parse(text):
        if field is not None and field not in names:
            names.append(field)
    return tuple(names)


def render_text(prefix: Prefix, slots: Mapping[str, Any]) -> str:
    """The full prompt: the prefix's head byte for byte, then the slots filled in.

    For a plain system prompt there are no slots; ``suffix`` (the only accepted keyword) is appended.
    """
    if not prefix.is_template:
        unknown = set(slots) - {"suffix"}
        if unknown:
            raise InvalidInputError(f"prefix {prefix.name!r} has no slots {sorted(unknown)}", field="slots")
        return prefix.text + str(slots.get("suffix", ""))
    missing = [n for n in template_slots(prefix.text) if n not in slots]
    if missing:
        raise InvalidInputError(f"prefix {prefix.name!r} needs slots {missing}", field="slots")
    try:
        rendered = prefix.text.format_map(dict(slots))
    except (KeyError, IndexError, AttributeError, ValueError) as exc:
        raise InvalidInputError(f"cannot render prefix {prefix.name!r}: {exc}", field="slots") from exc
    # The head has no fields, so formatting cannot change it; this guards that invariant.
    assert rendered.startswith(template_head(prefix.text, True))
    return rendered


def render_messages(prefix: Prefix, user: str, slots: Mapping[str, Any]) -> list[dict[str, str]]:
    """Chat form: the rendered prefix as the first (system) message, then the user turn."""
    return [
        {"role": "system", "content": render_text(prefix, slots)},
        {"role": "user", "content": user},
    ]


class Chunk(Protocol):
    """A retrieved passage: what :func:`assemble_prompt` needs of a search hit."""

    @property
    def id(self) -> str: ...

    @property
    def text(self) -> str: ...


def assemble_prompt(head: str, chunks: Iterable[Chunk] = (), volatile: str = "") -> str:
    """A RAG prompt that keeps hitting vLLM's prefix cache: ``head``, the chunks by id, ``volatile`` last.

    vLLM reuses KV blocks along a hash chain from the first token, so a request reuses cache only up to the
    first token where it differs from an earlier one. The registered head comes first, byte for byte; then the
    chunks in an order that depends only on which chunks were retrieved (their ids), not on this query's
    scores, so requests that retrieved the same or overlapping chunks share them; then what changes with
    every request (the question, a date), so it cuts the shared prefix as late as possible. A chunk retrieved
    twice is written once.
    """
    unique = {str(chunk.id): chunk.text for chunk in chunks}
    body = "".join(f"[{chunk_id}] {unique[chunk_id]}\n" for chunk_id in sorted(unique))
    return head + body + volatile


# Patterns for content that differs per request. Order matters: longer, more specific kinds first,
# and a span already claimed is not reported again by a later, vaguer pattern.
_VOLATILE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("uuid", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
    ("timestamp", re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?\b")),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b")),
    ("date", re.compile(
        r"\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{4}\b"
        r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2},? \d{4}\b")),
    ("time", re.compile(r"\b\d{1,2}:\d{2}:\d{2}\b")),
    ("unix timestamp", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?\b")),
    ("request id", re.compile(r"\b(?:req(?:uest)?|trace|session|user|msg|correlation)[-_ ]?id\s*[:=]\s*[^\s.,;]+",
                              re.IGNORECASE)),
    ("hex id", re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{16,}\b")),
)


def find_volatile(text: str) -> tuple[VolatileSpan, ...]:
    """Spans of ``text`` that look like per-request content (dates, times, UUIDs, ids), in text order."""
    claimed: list[tuple[int, int]] = []
    spans: list[VolatileSpan] = []
    for kind, pattern in _VOLATILE_PATTERNS:
        for m in pattern.finditer(text):
            if any(m.start() < end and start < m.end() for start, end in claimed):
                continue
            claimed.append((m.start(), m.end()))
            spans.append(VolatileSpan(kind, m.start(), m.end(), m.group()))
    return tuple(sorted(spans, key=lambda s: s.start))
