"""Labelled retrieval sets that people wrote: the questions of two FAQs and the answers written for them.

Task: given a question a user asked, find the answer written for it among every other answer of the same FAQ.

- **perlfaq** (Debian's ``perl-doc``): ``perlfaq1.pod`` … ``perlfaq9.pod``. Each ``=head2`` heading that ends in
  ``?`` is a query; the text up to the next ``=head1``/``=head2`` is its answer.
- **Python FAQ** (Debian's ``python3.11-doc``): the reStructuredText sources ``faq/*.rst.txt``. Each section
  title (a line underlined by a run of one punctuation character) that ends in ``?`` is a query; the text up to
  the next section title is its answer.
- **Documents**: every answer of the FAQ, one document each, with the markup reduced to its text (pod's ``C<…>``,
  ``L<text|target>``, reST's roles, links, directives and labels); code examples are kept as written.
- **Relevance**: exactly one document per query, the answer under its heading; every other answer is a distractor.
- **Dropped, mechanically**: answers of fewer than ``MIN_ANSWER_WORDS`` words (a heading whose text is all in its
  subsections), and any pair whose answer contains its question's text (so no query is found by copying).

The questions and answers were written by the FAQs' authors for each other; nothing in the derivation looks at any
retrieval system.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PERLFAQ_DIR", "PYTHON_FAQ_DIR", "FaqSet", "build_faq_sets", "parse_pod", "parse_rst", "perlfaq", "python_faq"]

def _perl_pod_dir() -> Path:
    """Where perl-doc put the pods: /usr/share/perl/<version>/pod (5.36.0 on Debian 12)."""
    found = sorted(Path("/usr/share/perl").glob("*/pod/perlfaq1.pod"))
    return found[-1].parent if found else Path("/usr/share/perl/5.36.0/pod")


PERLFAQ_DIR = _perl_pod_dir()
PYTHON_FAQ_DIR = Path("/usr/share/doc/python3.11/html/_sources/faq")
MIN_ANSWER_WORDS = 10

_POD_DOUBLE = re.compile(r"[A-Z]<<+\s+(.*?)\s+>>+", re.DOTALL)  # C<< $a <=> $b >>: may hold < and >
_POD_SINGLE = re.compile(r"[A-Z]<([^<>]*)>")  # C<x>, L<text|target>: innermost first
_RST_ROLE = re.compile(r":[a-z:]+:`([^`<]*?)\s*(?:<[^`>]*>)?`")  # :func:`breakpoint`, :mod:`text <target>`
_RST_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`_{1,2}")  # `text <url>`_
_RST_LITERAL = re.compile(r"``([^`]+)``")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")


@dataclass(frozen=True)
class FaqSet:
    name: str
    documents: list[dict]  # {"id", "text", "metadata": {"source": name}}
    queries: list[tuple[str, str]]  # (question, id of its answer)
    description: str


def parse_pod(text: str) -> list[tuple[str, str]]:
    """(question, answer) for each ``=head2`` of a pod file whose heading ends in ``?``."""
    pairs: list[tuple[str, str]] = []
    heading: str | None = None
    body: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        command = re.match(r"=(\w+)\s*(.*)", block, re.DOTALL)
        if command is None:
            if heading is not None:
                body.append(block)
            continue
        if command.group(1) in ("head1", "head2"):
            _close(pairs, heading, body)
            title = _pod_text(command.group(2))
            heading, body = (title if command.group(1) == "head2" and title.endswith("?") else None), []
        elif command.group(1) == "item" and heading is not None:
            body.append(command.group(2))  # a list item's label is part of the answer; =over/=back are not
    _close(pairs, heading, body)
    return [(question, _pod_text(answer)) for question, answer in pairs]


def parse_rst(text: str) -> list[tuple[str, str]]:
    """(question, answer) for each section title of a reST file that ends in ``?``."""
    lines = text.splitlines()
    titles = [n for n in range(1, len(lines)) if _RST_UNDERLINE.match(lines[n]) and lines[n - 1].strip()
              and len(lines[n].rstrip()) >= len(lines[n - 1].rstrip())]
    pairs: list[tuple[str, str]] = []
    for number, underline in enumerate(titles):
        title = lines[underline - 1].strip()
        if not title.endswith("?"):
            continue
        end = titles[number + 1] - 1 if number + 1 < len(titles) else len(lines)
        answer = _rst_text("\n".join(lines[underline + 1 : end]))
        pairs.append((_rst_inline(title), answer))
    return pairs


def _close(pairs: list[tuple[str, str]], heading: str | None, body: list[str]) -> None:
    if heading is not None:
        pairs.append((heading, "\n\n".join(body)))


def _pod_text(text: str) -> str:
    text = re.sub(r"[XZ]<[^>]*>", "", text)  # index entries and zero-width marks
    text = _POD_DOUBLE.sub(lambda m: m.group(1), text)
    previous = None
    while previous != text:  # nested codes (B<C<x>>) unwrap from the inside out
        previous = text
        text = _POD_SINGLE.sub(lambda m: m.group(1).split("|")[0], text)
    return _squeeze(text)


def _rst_text(text: str) -> str:
    kept = []
    for block in re.split(r"\n\s*\n", text):
        stripped = block.strip()
        if re.match(r"\.\. (_[^:]+:|\w[\w-]*::|only::)", stripped) and "\n" not in stripped:
            continue  # a label (.. _name:) or a one-line directive
        kept.append(re.sub(r"^\.\. [\w-]+::\s*", "", stripped))
    return _rst_inline("\n\n".join(kept))


def _rst_inline(text: str) -> str:
    text = _RST_ROLE.sub(r"\1", text)
    text = _RST_LINK.sub(r"\1", text)
    text = _RST_LITERAL.sub(r"\1", text)
    return _squeeze(text.replace("::\n", ":\n"))


def _squeeze(text: str) -> str:
    # Paragraph breaks stay; runs of spaces inside a line (pod wraps at 72 columns) become one.
    return "\n\n".join(" ".join(part.split()) for part in re.split(r"\n\s*\n", text.strip()) if part.strip())


def _normalised(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def _faq_set(name: str, pairs: list[tuple[str, str, str]], description: str) -> FaqSet:
    """``pairs`` are (file stem, question, answer) in file order; ids are ``<stem>:<position>``."""
    documents, queries, num_dropped = [], [], 0
    for position, (stem, question, answer) in enumerate(pairs):
        if len(answer.split()) < MIN_ANSWER_WORDS or _normalised(question) in _normalised(answer):
            num_dropped += 1
            continue
        doc_id = f"{stem}:{position}"
        documents.append({"id": doc_id, "text": answer, "metadata": {"source": name}})
        queries.append((question, doc_id))
    return FaqSet(name, documents, queries, f"{description}: {len(queries)} questions, each with its one answer "
                  f"among {len(documents)} ({num_dropped} pairs dropped by the rules)")


def perlfaq(folder: Path = PERLFAQ_DIR) -> FaqSet:
    files = [folder / f"perlfaq{n}.pod" for n in range(1, 10)]
    _require(files, "perl-doc")
    pairs = [(path.stem, q, a) for path in files for q, a in parse_pod(path.read_text(encoding="utf-8"))]
    return _faq_set("perlfaq", pairs, "perlfaq1-9 (Debian perl-doc)")


def python_faq(folder: Path = PYTHON_FAQ_DIR) -> FaqSet:
    files = sorted(folder.glob("*.rst.txt"))
    _require(files or [folder / "programming.rst.txt"], "python3.11-doc")
    pairs = [(path.name.split(".")[0], q, a) for path in files for q, a in parse_rst(path.read_text(encoding="utf-8"))]
    return _faq_set("python-faq", pairs, "Python 3.11 FAQ (Debian python3.11-doc)")


def build_faq_sets() -> list[FaqSet]:
    return [perlfaq(), python_faq()]


def _require(files: list[Path], package: str) -> None:
    missing = [path for path in files if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is missing: apt-get install {package} (make system-deps, mk/system.mk)")
