"""The benchmark workload: real text that ships with Python, and a seeded Zipf stream of requests over it.

Passages are paragraphs of the standard library's own prose: docstrings and other triple-quoted strings,
comment blocks, and the language reference that ``pydoc_data`` ships. Source files are read in sorted order
and scanned with regular expressions (no imports, no side effects), so the same Python installation always
yields the same corpus, in about a second. ``corpus_digest`` names it in every result file.
"""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

__all__ = ["Corpus", "ZipfStream", "build_corpus", "corpus_chunks", "zipf_stream"]

MIN_CHARS = 40
MAX_CHARS = 1000
MIN_LETTER_SHARE = 0.6  # drops code samples and tables: a passage is mostly letters and spaces

_TRIPLE_QUOTED = re.compile(r'("""|\'\'\')(.*?)\1', re.S)
_COMMENT_BLOCK = re.compile(r"(?:^[ \t]*#[^\n]*\n)+", re.M)
_BLANK_LINE = re.compile(r"\n\s*\n")


@dataclass(frozen=True)
class Corpus:
    passages: tuple[str, ...]
    source: str  # where the text came from, for the result files
    digest: str  # xxh3-64 of every passage in order: two runs compare only when equal

    def __len__(self) -> int:
        return len(self.passages)


@dataclass(frozen=True)
class ZipfStream:
    """Requests over a corpus: ``batches[i]`` is an array of passage indices (``batch_size`` each)."""

    batches: tuple[np.ndarray, ...]
    num_passages: int
    s: float
    seed: int

    @property
    def num_texts(self) -> int:
        return sum(len(batch) for batch in self.batches)

    @property
    def num_distinct(self) -> int:
        return len(np.unique(np.concatenate(self.batches))) if self.batches else 0

    @property
    def ideal_hit_rate(self) -> float:
        """1 - distinct/total: what a cache that never forgets serves (each distinct text computed once)."""
        return 1 - self.num_distinct / self.num_texts if self.batches else 0.0

    def texts(self, corpus: Corpus, batch: int) -> list[str]:
        return [corpus.passages[i] for i in self.batches[batch]]


def _paragraphs(text: str) -> list[str]:
    """Paragraphs of ``text`` with whitespace runs collapsed, kept when they read as prose."""
    kept = []
    for paragraph in _BLANK_LINE.split(text):
        paragraph = " ".join(paragraph.split())
        if MIN_CHARS <= len(paragraph) <= MAX_CHARS:
            letters = sum(char.isalpha() or char == " " for char in paragraph)
            if letters >= MIN_LETTER_SHARE * len(paragraph):
                kept.append(paragraph)
    return kept


def _source_texts(stdlib: Path):
    """Every prose-bearing string of the standard library, in a fixed order."""
    for path in sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts):
        source = path.read_text(encoding="utf-8", errors="replace")
        for match in _TRIPLE_QUOTED.finditer(source):
            yield match.group(2)
        for match in _COMMENT_BLOCK.finditer(source):
            yield "\n".join(line.strip().lstrip("#").strip() for line in match.group(0).splitlines())
    try:
        from pydoc_data.topics import topics  # the language reference, as plain text
    except ImportError:  # some distributions strip it; the source alone still gives > 30k passages
        return
    for name in sorted(topics):
        yield topics[name]


def build_corpus(min_passages: int = 20_000, stdlib: str | Path | None = None) -> Corpus:
    """All distinct passages of the standard library (first occurrence order); raises if fewer than asked."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    seen: dict[str, None] = {}
    for text in _source_texts(root):
        for paragraph in _paragraphs(text):
            seen.setdefault(paragraph)
    passages = tuple(seen)
    if len(passages) < min_passages:
        raise RuntimeError(f"only {len(passages)} distinct passages under {root}, {min_passages} needed")
    digest = xxhash.xxh3_64()
    for passage in passages:
        digest.update(passage.encode())
        digest.update(b"\0")
    return Corpus(passages, source=f"Python standard library at {root}", digest=digest.hexdigest())


def corpus_chunks(corpus: Corpus, count: int) -> list[str]:
    """``count`` distinct document chunks: runs of 2, 3, 4... consecutive passages (never a single passage,
    so no chunk is also a request text of the stream)."""
    chunks: list[str] = []
    seen: set[str] = set()
    span = 2
    while len(chunks) < count:
        if span > 16:
            raise RuntimeError(f"cannot make {count} distinct chunks from {len(corpus)} passages")
        for start in range(len(corpus) - span + 1):
            chunk = "\n\n".join(corpus.passages[start : start + span])
            if chunk not in seen:
                seen.add(chunk)
                chunks.append(chunk)
                if len(chunks) == count:
                    break
        span += 1
    return chunks


def zipf_stream(num_passages: int, num_batches: int, *, batch_size: int = 32, s: float = 1.1, seed: int = 0) -> ZipfStream:
    """A seeded stream of requests: passage ``order[k]`` has popularity rank k + 1 and probability
    proportional to ``(k + 1) ** -s`` (a finite Zipf). The rank order is itself a seeded permutation, so the
    popular passages come from all over the library rather than from its first files."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_passages)
    weights = np.arange(1, num_passages + 1, dtype=np.float64) ** -s
    cumulative = np.cumsum(weights / weights.sum())
    ranks = np.searchsorted(cumulative, rng.random(num_batches * batch_size), side="right")
    ranks = np.minimum(ranks, num_passages - 1)  # guards the last bucket against rounding in cumsum
    draws = order[ranks]
    batches = tuple(draws[i * batch_size : (i + 1) * batch_size] for i in range(num_batches))
    return ZipfStream(batches, num_passages, s, seed)
