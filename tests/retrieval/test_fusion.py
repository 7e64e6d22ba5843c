"""Fusion and MMR (ragcache.retrieval.fusion) and the ranking steps (ragcache.retrieval.ranking): pure logic, pinned exactly."""

from __future__ import annotations

import numpy as np
import pytest

from ragcache.errors import InvalidInputError
from ragcache.retrieval.fusion import mmr, reciprocal_rank, weighted
from ragcache.retrieval.ranking import SearchOptions, finish, fuse, group_hits
from ragcache.retrieval.results import SearchHit


def test_reciprocal_rank_sums_one_over_k_plus_rank():
    fused = reciprocal_rank([[("a", 0.9), ("b", 0.8)], [("b", 12.0), ("c", 3.0)]], k=60)
    assert fused == [("b", 1 / 62 + 1 / 61), ("a", 1 / 61), ("c", 1 / 62)]


def test_reciprocal_rank_ties_keep_first_appearance():
    assert [doc for doc, _ in reciprocal_rank([[("a", 1.0)], [("b", 1.0)]])] == ["a", "b"]


def test_weighted_scales_each_ranking_to_unit_range():
    fused = weighted([[("a", 0.9), ("b", 0.5)], [("b", 10.0), ("c", 2.0)]], [0.25, 0.75])
    assert fused == [("b", 0.75), ("a", 0.25), ("c", 0.0)]
    # One hit (or all equal) scales to 1: nothing to compare it with.
    assert weighted([[("a", 0.3)], []], [0.5, 0.5]) == [("a", 0.5)]


def test_mmr_trades_relevance_for_diversity():
    query = np.array([1.0, 0.0, 0.0])
    candidates = np.array([[1.0, 0.1, 0.0], [1.0, 0.12, 0.0], [0.7, 0.0, 0.7]])  # 0 and 1: near duplicates
    assert mmr(query, candidates, lambda_=1.0, num=3) == [0, 1, 2]
    assert mmr(query, candidates, lambda_=0.5, num=3) == [0, 2, 1]
    assert mmr(query, candidates, lambda_=0.5, num=0) == []


def hit(doc_id, score, source=None):
    return SearchHit(doc_id, score, f"text {doc_id}", {} if source is None else {"source": source})


def test_fuse_hybrid_rrf_keeps_texts_of_either_list():
    dense, keyword = [hit("a", 0.9), hit("b", 0.8)], [hit("c", 7.0), hit("a", 5.0)]
    fused = fuse(SearchOptions(mode="hybrid"), dense, keyword)
    assert [(h.id, h.text) for h in fused] == [("a", "text a"), ("c", "text c"), ("b", "text b")]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62)


def test_finish_thresholds_then_groups_then_pages():
    ranked = [hit("f1#0", 0.9, "f1"), hit("f1#1", 0.8, "f1"), hit("f2#0", 0.7, "f2"), hit("x", 0.6), hit("low", 0.1)]
    options = SearchOptions(group_by_source=True, group_size=2, score_threshold=0.5)
    page = finish(options, ranked, 2)
    assert [h.id for h in page] == ["f1#0", "f1#1", "f2#0"]
    assert [(g.source, g.ids) for g in group_hits(page, 2)] == [("f1", ("f1#0", "f1#1")), ("f2", ("f2#0",))]
    second = finish(SearchOptions(group_by_source=True, group_size=2, offset=2, score_threshold=0.5), ranked, 2)
    assert [h.id for h in second] == ["x"]
    assert [h.id for h in finish(SearchOptions(offset=1), ranked, 2)] == ["f1#1", "f2#0"]


@pytest.mark.parametrize(
    "options, field",
    [
        ({"mode": "sparse"}, "mode"),
        ({"fusion": "max"}, "fusion"),
        ({"offset": -1}, "offset"),
        ({"rrf_k": 0}, "rrf_k"),
        ({"mmr_lambda": 1.5}, "mmr_lambda"),
        ({"dense_weight": float("nan")}, "dense_weight"),
        ({"score_threshold": float("inf")}, "score_threshold"),
        ({"group_size": 0}, "group_size"),
        ({"group_by_source": "yes"}, "group_by_source"),
    ],
)
def test_bad_options_name_their_field(options, field):
    with pytest.raises(InvalidInputError) as caught:
        SearchOptions(**options)
    assert caught.value.field == field
