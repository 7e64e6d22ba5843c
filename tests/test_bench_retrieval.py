"""The labelled WordNet set and the ranking metrics of ``bench retrieval`` (the figures themselves are the
bench's; here only the derivation and the arithmetic)."""

from __future__ import annotations

import math

import pytest

from ragcache_bench.retrieval import Scores
from ragcache_bench.wordnet import WORDNET_DIR, build_retrieval_set

needs_wordnet = pytest.mark.skipif(not (WORDNET_DIR / "data.noun").is_file(), reason="wordnet-base is installed by make test")


def test_metrics_of_one_relevant_document():
    scores = Scores()
    scores.add(["r", "a"], "r", 0.01)  # rank 1
    scores.add(["a", "b", "r"], "r", 0.01)  # rank 3
    scores.add([f"x{n}" for n in range(10)] + ["r"], "r", 0.01)  # rank 11: outside the top 10
    assert scores.recall == [1.0, 1.0, 0.0]
    assert scores.mrr == [1.0, 1 / 3, 0.0]
    assert scores.ndcg == [1.0, 1 / math.log2(4), 0.0]
    assert scores.mean("recall") == pytest.approx(2 / 3)


@needs_wordnet
def test_wordnet_set_is_deterministic_and_every_label_names_a_document():
    first = build_retrieval_set(300, 50, seed=1)
    assert first == build_retrieval_set(300, 50, seed=1)
    assert first != build_retrieval_set(300, 50, seed=2)
    ids = {document["id"] for document in first.documents}
    assert len(ids) == len(first.documents) == 300
    assert len(first.queries) == 50 and all(relevant in ids for _, relevant in first.queries)
    texts = {document["id"]: document["text"] for document in first.documents}
    for query, relevant in first.queries:
        assert query not in texts[relevant]  # the example sentence is left out of its own document
        lemmas = texts[relevant].split(":")[0].split(", ")
        assert any(lemma in query.lower() for lemma in lemmas)


@needs_wordnet
def test_other_senses_of_a_word_are_in_the_collection_as_distractors():
    labelled = build_retrieval_set(300, 50, seed=0)
    lemma_counts: dict[str, int] = {}
    for document in labelled.documents:
        for lemma in document["text"].split(":")[0].split(", "):
            lemma_counts[lemma] = lemma_counts.get(lemma, 0) + 1
    assert sum(1 for count in lemma_counts.values() if count >= 2) >= 20
