"""The labelled sets and the ranking metrics, intervals, fusion tuning and verdict of ``bench retrieval`` (the
figures themselves are the bench's; here only the derivations and the arithmetic). A missing data set skips on a
developer's machine and fails under CI, where `make test` has installed it (mk/system.mk)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ragcache.retrieval.results import SearchHit
from ragcache_bench.faq import PERLFAQ_DIR, PYTHON_FAQ_DIR, parse_pod, parse_rst, perlfaq, python_faq
from ragcache_bench.retrieval import headword_idf_ranking
from ragcache_bench.retrieval_stats import (
    Scores,
    Split,
    bootstrap_ci,
    evaluate_split,
    paired_difference,
    split_halves,
    splits_difference,
    tune_fusion,
    tuned_hybrid,
    winning_mode,
)
from ragcache_bench.wordnet import WORDNET_DIR, build_retrieval_set
from tests.conftest import in_ci


def _require(path: Path, package: str) -> None:
    if path.is_file():
        return
    message = f"{path} is missing: {package} is installed by make test (mk/system.mk)"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def wordnet() -> None:
    _require(WORDNET_DIR / "data.noun", "wordnet-base")


@pytest.fixture
def faqs() -> None:
    _require(PERLFAQ_DIR / "perlfaq4.pod", "perl-doc")
    _require(PYTHON_FAQ_DIR / "programming.rst.txt", "python3.11-doc")


def test_metrics_of_one_relevant_document():
    scores = Scores()
    scores.add(["r", "a"], "r", 0.01)  # rank 1
    scores.add(["a", "b", "r"], "r", 0.01)  # rank 3
    scores.add([f"x{n}" for n in range(10)] + ["r"], "r", 0.01)  # rank 11: outside the top 10
    assert scores.recall == [1.0, 1.0, 0.0]
    assert scores.mrr == [1.0, 1 / 3, 0.0]
    assert scores.ndcg == [1.0, 1 / math.log2(4), 0.0]
    assert scores.mean("recall") == pytest.approx(2 / 3)


POD = """=head1 NAME

perlfaqX - a test

=head2 How do I reverse a string?

Use C<reverse()> in scalar context, as L<the manual|perlfunc/reverse> says:

    my $reversed = reverse $string;

=head2 Notes, not a question

Left out: the heading does not ask.

=head2 Why is B<C<int()>> broken?

Your int() is most probably working just fine. It is the numbers that are not what you think.

=head1 AUTHOR
"""

RST = """Programming FAQ
===============

How do I reverse a list?
------------------------

Use :meth:`list.reverse` or the `reversed <https://example.org>`_ built-in, or ``a[::-1]``.

.. _label:

Why are default values shared between objects?
----------------------------------------------

Default values are created exactly once, when the function is defined.

Plain section
-------------

Not a question.
"""


def test_pod_questions_are_the_head2_headings_that_ask_and_answers_lose_their_markup():
    pairs = parse_pod(POD)
    assert [question for question, _ in pairs] == ["How do I reverse a string?", "Why is int() broken?"]
    answer = pairs[0][1]
    assert answer.startswith("Use reverse() in scalar context, as the manual says:")
    assert "my $reversed = reverse $string;" in answer and "C<" not in answer
    assert "Notes" not in answer and "Left out" not in pairs[1][1]


def test_rst_questions_are_the_section_titles_that_ask_and_answers_lose_their_markup():
    pairs = parse_rst(RST)
    assert [question for question, _ in pairs] == ["How do I reverse a list?", "Why are default values shared between objects?"]
    assert pairs[0][1] == "Use list.reverse or the reversed built-in, or a[::-1]."
    assert pairs[1][1] == "Default values are created exactly once, when the function is defined."


@pytest.mark.usefixtures("faqs")
@pytest.mark.parametrize("build", [perlfaq, python_faq])
def test_faq_sets_pair_each_question_with_its_own_answer_which_never_contains_it(build):
    labelled = build()
    assert labelled == build()  # mechanical: the same files give the same set
    texts = {document["id"]: document["text"] for document in labelled.documents}
    assert len(texts) == len(labelled.documents) == len(labelled.queries) >= 150
    assert [relevant for _, relevant in labelled.queries] == list(texts)  # one query per answer, one answer per query
    for question, relevant in labelled.queries:
        assert question.endswith("?")
        assert question.lower() not in texts[relevant].lower()
        assert len(texts[relevant].split()) >= 10


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_queries():
    values = [1.0, 0.0] * 50
    low, high = bootstrap_ci(values, seed=0)
    assert low < 0.5 < high
    wide = bootstrap_ci([1.0, 0.0] * 5, seed=0)
    assert wide[1] - wide[0] > high - low
    assert bootstrap_ci([0.7] * 20, seed=0) == pytest.approx((0.7, 0.7))


def test_paired_difference_is_the_mean_of_per_query_differences():
    mean, low, high = paired_difference([1.0, 1.0, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5], seed=0)
    assert mean == pytest.approx(0.25)
    assert 0 <= low <= mean <= high <= 0.5


def test_halves_are_disjoint_seeded_and_cover_every_query():
    queries = [(f"q{n}", f"d{n}") for n in range(11)]
    tune, report = split_halves(queries, seed=3)
    assert (tune, report) == split_halves(queries, seed=3)
    assert len(tune) == 5 and len(report) == 6 and sorted(tune + report) == sorted(queries)


def _hits(*ids: str) -> tuple[SearchHit, ...]:
    return tuple(SearchHit(doc_id, 1.0 - n / 100, "", {}) for n, doc_id in enumerate(ids))


def test_fusion_tuning_picks_the_weight_that_ranks_the_relevant_documents_first():
    # Keyword puts the relevant document first and dense puts it last: the best weight leans on keyword.
    candidates = [(_hits("a", "b", "c", f"r{n}"), _hits(f"r{n}", "a"), f"r{n}") for n in range(5)]
    tuned = tune_fusion(candidates)
    assert tuned["weighted"]["dense_weight"] == 0.0
    assert tuned["weighted"]["ndcg_by_dense_weight"][0.0] == pytest.approx(1.0)
    assert tuned["weighted"]["ndcg_by_dense_weight"][1.0] == pytest.approx(1 / math.log2(5))
    assert tuned["rrf"]["ndcg_by_rrf_k"][tuned["rrf"]["rrf_k"]] == max(tuned["rrf"]["ndcg_by_rrf_k"].values())


def _split(seed: int, report: list[int], dense: list[float], keyword: list[float], hybrid: list[float]) -> Split:
    return Split(seed, {}, "hybrid", tuple(report), {"dense": dense, "keyword": keyword, "hybrid": hybrid})


def test_splits_difference_is_the_mean_over_splits_of_each_report_halfs_paired_difference():
    first = _split(0, [0, 1, 2, 3], [0.5] * 4, [0.5] * 4, [0.6, 0.6, 0.7, 0.7])  # hybrid +0.15 (+0.1 or +0.2 a query)
    second = _split(1, [4, 5, 6, 7], [0.5] * 4, [0.4] * 4, [0.55] * 4)  # hybrid +0.05
    mean, low, high = splits_difference([first, second], "hybrid", 8, seed=0)
    assert mean == pytest.approx(0.10)
    assert 0.075 <= low < mean < high <= 0.125  # only the first split's queries vary: (0.1 .. 0.2 + 0.05) / 2
    # Keyword: 0 on the first split's queries and -0.1 on every one of the second's, whichever queries are drawn.
    assert splits_difference([first, second], "keyword", 8, seed=0) == pytest.approx((-0.05, -0.05, -0.05))
    same = _split(0, list(range(8)), [0.5] * 8, [0.5] * 8, [0.6] * 8)
    assert splits_difference([same, same], "hybrid", 8, seed=0) == pytest.approx((0.1, 0.1, 0.1))


def test_dense_stays_the_winner_unless_another_mode_beats_it_over_the_splits():
    dense = [0.5, 0.6, 0.7, 0.4] * 25
    def splits(keyword, hybrid):  # two halvings of 200 queries, the same scores on each
        return [_split(seed, list(range(seed * 100, seed * 100 + 100)), dense, keyword, hybrid) for seed in (0, 1)]
    assert winning_mode(splits([v - 0.2 for v in dense], dense), 200) == "dense"
    noisy = [v + (0.3 if n % 2 else -0.29) for n, v in enumerate(dense)]  # a mean just above dense, interval across 0
    assert winning_mode(splits(dense, noisy), 200) == "dense"
    better = [v + 0.1 for v in dense]
    assert winning_mode(splits(dense, better), 200) == "hybrid"
    assert winning_mode(splits([v + 0.05 for v in dense], better), 200) == "hybrid"
    # One split's clear win does not carry a second split where hybrid loses as much.
    mixed = [_split(0, list(range(100)), dense, dense, better), _split(1, list(range(100, 200)), dense, dense, [v - 0.1 for v in dense])]
    assert winning_mode(mixed, 200) == "dense"


def test_a_split_tunes_on_one_half_and_scores_every_mode_on_the_other():
    # Keyword puts the relevant document first and dense puts it fourth: tuning leans on keyword.
    first = [(_hits("a", "b", "c", f"r{n}"), _hits(f"r{n}", "a"), f"r{n}") for n in range(6)]
    second = [(_hits(f"s{n}", "a"), _hits("a", f"s{n}"), f"s{n}") for n in range(4)]
    split = evaluate_split([first, second], seed=2)
    tune, report = split_halves(range(6), seed=2)
    assert sorted(split.report) == sorted(report + [6 + n for n in split_halves(range(4), seed=2)[1]])
    assert len(split.report) == 3 + 2
    scores = dict(zip(split.report, zip(split.ndcg["dense"], split.ndcg["keyword"], split.ndcg["hybrid"], strict=True), strict=True))
    assert scores[report[0]] == pytest.approx((1 / math.log2(5), 1.0, 1.0))
    assert scores[split.report[-1]][0] == 1.0 and scores[split.report[-1]][1] == pytest.approx(1 / math.log2(3))
    assert split.hybrid_name == tuned_hybrid(split.tuning)[0]


def test_headword_idf_ranks_documents_whose_headwords_the_query_names():
    documents = [
        {"id": "bank1", "text": "bank: sloping land"},
        {"id": "bank2", "text": "bank, depository: a financial institution"},
        {"id": "river", "text": "river: a large stream"},
    ]
    assert headword_idf_ranking(documents, "they sat on the river bank") == ["river", "bank1", "bank2"]
    assert headword_idf_ranking(documents, "a depository of the bank") == ["bank2", "bank1"]
    assert headword_idf_ranking(documents, "nothing in common") == []


@pytest.mark.usefixtures("wordnet")
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


@pytest.mark.usefixtures("wordnet")
def test_other_senses_of_a_word_are_in_the_collection_as_distractors():
    labelled = build_retrieval_set(300, 50, seed=0)
    lemma_counts: dict[str, int] = {}
    for document in labelled.documents:
        for lemma in document["text"].split(":")[0].split(", "):
            lemma_counts[lemma] = lemma_counts.get(lemma, 0) + 1
    assert sum(1 for count in lemma_counts.values() if count >= 2) >= 20
