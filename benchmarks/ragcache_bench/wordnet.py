"""A labelled retrieval set derived mechanically from WordNet (Debian's ``wordnet-base``), which no one here wrote.

Task: given a usage example of a word, find the dictionary entry of the sense it is used in.

- **Documents**: WordNet synsets (nouns, verbs, adjectives, adverbs), each as ``"lemma, lemma: definition"``
  (the gloss up to its first quoted example; underscores in lemmas become spaces).
- **Queries**: a synset's first example sentence (the quoted parts of its gloss) that contains one of its lemmas
  as a whole word; the example is left out of the documents.
- **Relevance**: exactly one document per query, the synset the example belongs to.
- **Which synsets**: lemmas with two or more senses are taken in a seeded random order, and for each, every synset
  holding it joins the collection (so the other senses of the same word are in it as distractors) until the
  document budget is reached; every collected synset with a usable example gives a query, up to the query budget,
  in a seeded random order.

Nothing in the derivation looks at any retrieval system, so the labels cannot favour one.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WORDNET_DIR", "Synset", "RetrievalSet", "read_synsets", "build_retrieval_set"]

WORDNET_DIR = Path("/usr/share/wordnet")
POS_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
_EXAMPLE = re.compile(r'"([^"]+)"')


@dataclass(frozen=True)
class Synset:
    id: str  # "<pos>:<offset>", unique across the four files
    lemmas: tuple[str, ...]
    definition: str
    examples: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"{', '.join(self.lemmas)}: {self.definition}"


@dataclass(frozen=True)
class RetrievalSet:
    documents: list[dict]  # {"id", "text", "metadata": {"source": "wordnet"}}
    queries: list[tuple[str, str]]  # (query text, id of the one relevant document)
    description: str


def _parse_line(pos_file: str, line: str) -> Synset | None:
    if line.startswith("  ") or "|" not in line:
        return None  # the licence header, or a line without a gloss
    fields, gloss = line.split("|", 1)
    parts = fields.split()
    num_words = int(parts[3], 16)
    lemmas = tuple(dict.fromkeys(_clean_lemma(parts[4 + 2 * n]) for n in range(num_words)))
    gloss = gloss.strip()
    quote = gloss.find('"')
    definition = (gloss if quote < 0 else gloss[:quote]).strip().rstrip(";").strip()
    examples = tuple(example.strip() for example in _EXAMPLE.findall(gloss[quote:] if quote >= 0 else ""))
    return Synset(f"{pos_file[5:]}:{parts[0]}", lemmas, definition, examples)


def _clean_lemma(lemma: str) -> str:
    # Adjective lemmas carry a syntactic marker such as "(a)" or "(p)"; multiword lemmas use underscores.
    return re.sub(r"\([a-z]+\)$", "", lemma).replace("_", " ").lower()


def read_synsets(folder: Path = WORDNET_DIR) -> Iterator[Synset]:
    for pos_file in POS_FILES:
        with (folder / pos_file).open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                synset = _parse_line(pos_file, line)
                if synset is not None and synset.definition:
                    yield synset


def _usable_example(synset: Synset) -> str | None:
    for example in synset.examples:
        if any(re.search(rf"\b{re.escape(lemma)}\b", example, re.IGNORECASE) for lemma in synset.lemmas):
            return example
    return None


def build_retrieval_set(num_documents: int, num_queries: int, *, seed: int = 0, folder: Path = WORDNET_DIR) -> RetrievalSet:
    if not (folder / POS_FILES[0]).is_file():
        raise FileNotFoundError(f"WordNet is not installed at {folder}: apt-get install wordnet-base (mk/system.mk)")
    synsets = list(read_synsets(folder))
    lemma_to_synsets: dict[str, list[Synset]] = {}
    for synset in synsets:
        for lemma in synset.lemmas:
            lemma_to_synsets.setdefault(lemma, []).append(synset)
    polysemous = sorted(lemma for lemma, senses in lemma_to_synsets.items() if len(senses) >= 2)
    rng = random.Random(seed)
    rng.shuffle(polysemous)
    chosen: dict[str, Synset] = {}
    for lemma in polysemous:
        if len(chosen) >= num_documents:
            break
        for synset in lemma_to_synsets[lemma]:
            chosen.setdefault(synset.id, synset)
    collected = list(chosen.values())[:num_documents]
    queries = [(example, synset.id) for synset in collected if (example := _usable_example(synset)) is not None]
    rng.shuffle(queries)
    documents = [{"id": synset.id, "text": synset.text, "metadata": {"source": "wordnet"}} for synset in collected]
    description = (
        f"WordNet 3.0 (wordnet-base): {len(documents)} synsets of {len(synsets)}, "
        f"{min(num_queries, len(queries))} example-sentence queries (seed {seed})"
    )
    return RetrievalSet(documents, queries[:num_queries], description)
