"""Turn files into documents: text, Markdown, PDF and HTML split into paragraph chunks, JSONL one document a line.

A folder is read whole except hidden files and folders (``.git``); a file of another kind is skipped and named
(:func:`find_sources`), and so is a file that cannot be read (:func:`read_documents`), with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ragcache.errors import InvalidInputError
from ragcache.retrieval.readers import READERS, UnreadableFileError, read_text

__all__ = [
    "SUFFIXES",
    "SkippedFile",
    "Sources",
    "UnreadableFileError",
    "chunk_text",
    "file_documents",
    "find_sources",
    "iter_documents",
    "read_documents",
    "source_files",
]

SUFFIXES = {*READERS, ".jsonl"}


@dataclass(frozen=True)
class SkippedFile:
    """A file ingest did not read, by its source name, and why."""

    source: str
    reason: str


@dataclass(frozen=True)
class Sources:
    """What ingest reads from a path: each file with its source name, and the files it skips."""

    files: list[tuple[Path, str]]
    skipped: list[SkippedFile] = field(default_factory=list)


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


def find_sources(path: str | Path) -> Sources:
    """The files ingest reads from a file or a folder, each with its source name (its path in the folder), and the
    files of a folder it skips for their kind. A file named on its own is read whatever its suffix says."""
    root = Path(path)
    if root.is_file():
        return Sources([(root, root.name)])
    if not root.is_dir():
        raise InvalidInputError(f"{root} does not exist", field="path")
    files, skipped = [], []
    for file in sorted(root.rglob("*")):
        name = file.relative_to(root).as_posix()
        if any(part.startswith(".") for part in file.relative_to(root).parts) or not file.is_file():
            continue  # hidden (.git, .DS_Store): not documents, and not worth a line each
        if file.suffix.lower() in SUFFIXES:
            files.append((file, name))
        else:
            skipped.append(SkippedFile(name, f"not a kind ingest reads ({', '.join(sorted(SUFFIXES))})"))
    return Sources(files, skipped)


def source_files(path: str | Path) -> list[tuple[Path, str]]:
    """The files ingest reads from a file or a folder, each with its source name (:func:`find_sources`)."""
    return find_sources(path).files


def iter_documents(path: str | Path, *, max_chars: int = 1200) -> Iterator[dict]:
    """Documents ``{"id", "text", "metadata"}`` from a file or a folder; ids are stable (file + chunk number).
    A file that cannot be read raises :class:`UnreadableFileError`; :func:`read_documents` names it and goes on."""
    for file, name in source_files(path):
        yield from file_documents(file, name, max_chars=max_chars)


def read_documents(files: list[tuple[Path, str]], skipped: list[SkippedFile], *, max_chars: int = 1200) -> Iterator[dict]:
    """The documents of ``files``, in order; each file that cannot be read is appended to ``skipped`` instead."""
    for file, name in files:
        try:
            # One file's documents at a time, so a file failing halfway sends none of them (JSONL streams: its
            # lines are documents already, and a bad line is the caller's data error, not an unreadable file).
            documents = file_documents(file, name, max_chars=max_chars)
            if file.suffix.lower() != ".jsonl":
                documents = iter(list(documents))
            first = next(documents, None)
        except UnreadableFileError as exc:
            skipped.append(SkippedFile(name, str(exc)))
            continue
        if first is None:
            skipped.append(SkippedFile(name, "no text in it"))
            continue
        yield first
        yield from documents


def file_documents(file: Path, name: str, *, max_chars: int = 1200) -> Iterator[dict]:
    """The documents of one file whose source name is ``name`` (``source_files``)."""
    if file.suffix.lower() == ".jsonl":
        yield from _jsonl_documents(file, name)
        return
    text = read_text(file)
    for number, chunk in enumerate(chunk_text(text, max_chars)):
        yield {"id": f"{name}#{number}", "text": chunk, "metadata": {"source": name, "chunk": number}}


def _jsonl_documents(file: Path, name: str) -> Iterator[dict]:
    try:
        lines = file.open(encoding="utf-8")
    except OSError as exc:
        raise UnreadableFileError(f"cannot read it ({exc.strerror or exc})") from exc
    with lines:
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
