from ragcache_server.embedding.tokens import TokenCounts


def test_each_distinct_text_is_tokenized_once_and_totals_count_repeats():
    calls = []

    def count(texts):
        calls.append(list(texts))
        return [len(text.split()) for text in texts]

    counts = TokenCounts(count, max_entries=3)
    assert counts.total(["a b", "c", "a b"]) == 5
    assert counts.total(["c", "a b"]) == 3
    assert calls == [["a b", "c"]]
    counts.total(["x", "y"])  # pushes the oldest entries out of the memo
    counts.total(["a b"])
    assert calls[-1] == ["a b"]


def test_known_total_answers_only_from_the_memo_and_never_tokenizes():
    calls = []

    def count(texts):
        calls.append(list(texts))
        return [len(text.split()) for text in texts]

    counts = TokenCounts(count)
    assert counts.known_total(["a b", "c"]) is None  # "c" never counted: the caller must tokenize, off the loop
    assert calls == []
    counts.total(["a b", "c"])
    assert counts.known_total(["c", "a b", "c"]) == 4
    assert calls == [["a b", "c"]]
