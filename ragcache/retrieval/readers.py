"""The text of one file, by its kind: plain text and Markdown as they are, PDF through pypdf, HTML through selectolax.

A file that cannot be read raises :class:`UnreadableFileError` with the reason in words, so ingest can name it
and go on with the rest instead of dropping it silently or stopping the whole run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ragcache.errors import InvalidInputError

__all__ = ["READERS", "UnreadableFileError", "read_text"]


class UnreadableFileError(InvalidInputError):
    """A file ingest supports whose text cannot be read; the message says why (damaged, encrypted, no text)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="path")


def _plain_text(file: Path) -> str:
    # errors="replace": a stray byte in a text file costs one character, not the file.
    return file.read_text(encoding="utf-8", errors="replace")


def _pdf_text(file: Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(file)
        if reader.is_encrypted and not reader.decrypt(""):
            raise UnreadableFileError("the PDF is encrypted (a password is needed)")
        # Pages as paragraphs: chunking then keeps a chunk within a page where it can.
        pages = [page.extract_text() or "" for page in reader.pages]
    except UnreadableFileError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # pypdf raises its own errors for a damaged file, and plain ones from deep in a malformed object tree.
        raise UnreadableFileError(f"not a readable PDF ({type(exc).__name__}: {exc})") from exc
    text = "\n\n".join(page.strip() for page in pages if page.strip())
    if not text:
        raise UnreadableFileError("the PDF has no text layer (a scanned PDF needs OCR first)")
    return text


# Tags whose start begins a new paragraph; the text inside any other tag runs on (bold, links, spans).
_BLOCK_TAGS = frozenset(
    "address article aside blockquote br dd div dl dt figcaption figure footer form h1 h2 h3 h4 h5 h6 header hr li "
    "main nav ol p pre section table td th tr ul".split()
)
# Never text a reader sees.
_HIDDEN_TAGS = ["script", "style", "noscript", "template", "head", "svg"]
_SPACES = re.compile(r"\s+")


def _html_text(file: Path) -> str:
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(file.read_bytes())
    tree.strip_tags(_HIDDEN_TAGS)
    if tree.body is None:
        return ""
    paragraphs: list[list[str]] = [[]]
    for node in tree.body.traverse(include_text=True):
        if node.tag == "-text":
            paragraphs[-1].append(node.text_content or "")
        elif node.tag in _BLOCK_TAGS and paragraphs[-1]:
            paragraphs.append([])
    # HTML collapses whitespace within a paragraph; blank lines between paragraphs are what chunking splits on.
    cleaned = (_SPACES.sub(" ", "".join(words)).strip() for words in paragraphs)
    return "\n\n".join(paragraph for paragraph in cleaned if paragraph)


# By lower-case suffix. JSONL is not here: its lines are documents already (ragcache.retrieval.ingest).
READERS: dict[str, Callable[[Path], str]] = {
    ".txt": _plain_text,
    ".md": _plain_text,
    ".markdown": _plain_text,
    ".rst": _plain_text,
    ".pdf": _pdf_text,
    ".html": _html_text,
    ".htm": _html_text,
}


def read_text(file: Path) -> str:
    """The text of ``file`` by its suffix (any other suffix: plain text, as a file named on its own is read);
    :class:`UnreadableFileError` when it cannot be read."""
    reader = READERS.get(file.suffix.lower(), _plain_text)
    try:
        return reader(file)
    except OSError as exc:
        raise UnreadableFileError(f"cannot read it ({exc.strerror or exc})") from exc
