"""Turn files into documents: text and Markdown split into paragraph chunks, JSONL one document a line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ragcache.errors import InvalidInputError

__all__ = ["iter_documents", "source_files", "file_documents", "chunk_text", "SUFFIXES"]

SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".jsonl"}


def chunk_text(text: str, max_chars: int = 1200) -> list[str]:
    """Paragraphs (blank-line separated), merged up to ``max_chars``; a longer paragraph is split on spaces."""
    chunks: list[str] = []
    current = ""
    for paragraph in (p.strip() for p in text.split("\n\n")):
        for piece in _split_long(paragraph, max_chars):
            if current and len(current) + 2 + len(piece) > max_chars:
                chunks.append(current)
                current = ""
            current = f"{current}\n\n{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


def _split_long(paragraph: str, max_chars: int) -> list[str]:
    pieces = []
    while len(paragraph) > max_chars:
        cut = paragraph.rfind(" ", 0, max_chars)
        cut = cut if cut > 0 else max_chars
        pieces.append(paragraph[:cut].strip())
        paragraph = paragraph[cut:].strip()
    return pieces + [paragraph] if paragraph else pieces


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    raise InvalidInputError(f"{path} does not exist", field="path")


def iter_documents(path: str | Path, *, max_chars: int = 1200) -> Iterator[dict]:
    """Documents ``{"id", "text", "metadata"}`` from a file or a folder; ids are stable (file + chunk number)."""
    for file, name in source_files(path):
        yield from file_documents(file, name, max_chars=max_chars)


def source_files(path: str | Path) -> list[tuple[Path, str]]:
    """The files ingest reads from a file or a folder, each with its source name (its path in the folder)."""
    root = Path(path)
    return [(file, str(file.relative_to(root)) if root.is_dir() else file.name) for file in _files(root)]


def file_documents(file: Path, name: str, *, max_chars: int = 1200) -> Iterator[dict]:
    """The documents of one file whose source name is ``name`` (``source_files``)."""
    if file.suffix.lower() == ".jsonl":
        yield from _jsonl_documents(file, name)
        return
    text = file.read_text(encoding="utf-8", errors="replace")
    for number, chunk in enumerate(chunk_text(text, max_chars)):
        yield {"id": f"{name}#{number}", "text": chunk, "metadata": {"source": name, "chunk": number}}


def _jsonl_documents(file: Path, name: str) -> Iterator[dict]:
    with file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                text = record["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise InvalidInputError(f"{name}:{number}: each line must be a JSON object with a 'text' field ({exc})") from exc
            metadata = {"source": name, **record.get("metadata", {})}
            yield {"id": str(record.get("id", f"{name}#{number}")), "text": text, "metadata": metadata}
