"""The benchmark workload: the corpus and the Zipf stream are real, large enough and deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from ragcache_bench.corpus import build_corpus, corpus_chunks, zipf_stream


@pytest.fixture(scope="module")
def corpus():
    return build_corpus()


def test_corpus_has_20k_distinct_prose_passages(corpus):
    assert len(corpus) >= 20_000
    assert len(set(corpus.passages)) == len(corpus.passages)
    assert all(40 <= len(p) <= 1000 for p in corpus.passages)
    # Real prose, not lorem ipsum: the standard library's own words are in it.
    assert any("Return" in p for p in corpus.passages[:2000])
    assert not any("lorem ipsum" in p.lower() for p in corpus.passages)


def test_corpus_is_deterministic(corpus):
    again = build_corpus()
    assert again.passages == corpus.passages
    assert again.digest == corpus.digest


def test_corpus_raises_when_too_small(tmp_path):
    (tmp_path / "a.py").write_text('"""One short module docstring that reads like prose."""\n')
    with pytest.raises(RuntimeError, match=r"only \d+ distinct passages under .*, 1000000000 needed"):
        build_corpus(min_passages=10**9, stdlib=tmp_path)


def test_chunks_are_distinct_and_never_a_single_passage(corpus):
    chunks = corpus_chunks(corpus, 1000)
    assert len(chunks) == len(set(chunks)) == 1000
    assert not set(chunks) & set(corpus.passages)
    assert chunks[0] == corpus.passages[0] + "\n\n" + corpus.passages[1]


def test_zipf_stream_is_seeded():
    a = zipf_stream(20_000, 50, seed=3)
    b = zipf_stream(20_000, 50, seed=3)
    c = zipf_stream(20_000, 50, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a.batches, b.batches))
    assert not all(np.array_equal(x, y) for x, y in zip(a.batches, c.batches))
    assert len(a.batches) == 50 and all(len(batch) == 32 for batch in a.batches)
    assert a.num_texts == 1600


def test_zipf_stream_follows_the_law():
    stream = zipf_stream(1000, 2000, batch_size=32, s=1.1, seed=0)
    draws = np.concatenate(stream.batches)
    counts = np.bincount(draws, minlength=1000)
    by_rank = np.sort(counts)[::-1]
    # Rank 1 against rank 10: (10/1) ** 1.1 = 12.6 in expectation; 64,000 draws keep it close.
    assert 9 < by_rank[0] / by_rank[9] < 17
    expected_top = (1 / np.arange(1, 1001) ** 1.1).sum()
    assert by_rank[0] / len(draws) == pytest.approx(1 / expected_top, rel=0.05)


def test_ideal_hit_rate_is_one_minus_distinct_over_total():
    stream = zipf_stream(500, 10, batch_size=4, seed=1)
    draws = np.concatenate(stream.batches)
    assert stream.num_distinct == len(set(draws.tolist()))
    assert stream.ideal_hit_rate == pytest.approx(1 - stream.num_distinct / 40)
