import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest

from ragcache.core.keys import EmbeddingSpace, KeyMemo, key_digests, text_hash
from ragcache.errors import InvalidInputError, InvalidTextError

BASE = dict(model="m", revision="r1", dtype="float32", dim=384, normalize=False, max_seq_length=256)


def space(**changes) -> EmbeddingSpace:
    return EmbeddingSpace(**{**BASE, **changes})


def test_key_has_the_documented_shape():
    (key,) = space().keys(["hello"])
    assert re.fullmatch(r"rc:[0-9a-f]{16}:[0-9a-f]{32}", key)
    assert key.endswith(text_hash("hello"))


def test_same_text_same_space_same_key_in_another_process():
    texts = ["hello", "", "naïve café 🤖", "a\x00b"]
    keys = space().keys(texts)
    code = (
        "import json, sys; from ragcache.core.keys import EmbeddingSpace; "
        f"s = EmbeddingSpace(**{BASE!r}); print(json.dumps(s.keys(json.loads(sys.stdin.read()))))"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == keys


@pytest.mark.parametrize(
    "change",
    [
        {"model": "other"},
        {"revision": "r2"},
        {"dtype": "float16"},
        {"dtype": "bfloat16"},
        {"dim": 256},
        {"normalize": True},
        {"max_seq_length": 128},
        {"prompt": "query: "},
        {"text_normalization": "NFC"},
        {"provider": "openai"},
        {"endpoint": "https://api.example.com:443/v1"},
        {"prompt_name": "query"},
    ],
)
def test_anything_that_changes_the_vector_changes_the_key(change):
    assert space(**change).keys(["hello"]) != space().keys(["hello"])
    assert space(**change).space_id != space().space_id


def test_space_id_is_stable_and_described():
    assert space().space_id == space().space_id
    described = space(prompt="q: ").describe()
    assert described["space_id"] == space(prompt="q: ").space_id
    assert described["prompt"] == "q: " and described["model"] == "m"


def test_fields_added_later_leave_existing_space_ids_unchanged():
    # Pinned: ids of spaces made before namespace/provider/endpoint/prompt_name existed (key format 2). Their
    # stored vectors (L2 keys, L3 collections) stay reachable only while these stay the same.
    assert EmbeddingSpace("m", "r", "float32", 384, False, 256).space_id == "516ebc61c80e0bd7"
    assert "provider" not in space().describe() and "endpoint" not in space().describe()


def test_texts_of_any_content_get_distinct_keys():
    texts = ["", " ", "a", "a ", "A", "\x00", "\x00\x00", "🤖", "e\u0301", "\u00e9", "x" * 1_000_000]
    keys = space().keys(texts)
    assert len(set(keys)) == len(texts)  # no silent normalisation: NFD "é" and NFC "é" differ


def test_explicit_normalization_unifies_equivalent_texts():
    normalized = space(text_normalization="NFC")
    assert normalized.keys(normalized.prepare(["e\u0301"])) == normalized.keys(normalized.prepare(["\u00e9"]))


def test_lone_surrogate_is_rejected_with_its_position():
    with pytest.raises(InvalidTextError) as info:
        space().keys(["fine", "bad \ud800 text"])
    assert info.value.index == 1
    assert "surrogate" in str(info.value) and info.value.field == "inputs[1]"


def test_non_string_is_rejected_naming_the_item():
    with pytest.raises(InvalidInputError, match="item 2 is int"):
        space().keys(["a", "b", 3])


def test_invalid_space_is_rejected():
    with pytest.raises(InvalidInputError):
        space(dtype="int8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        space().model = "x"


def test_the_key_memo_gives_the_spaces_keys_and_digests():
    memo, texts = KeyMemo(), ["a", "b", "a", "é"]
    first, again = memo.keys(space(), texts), memo.keys(space(), texts)
    assert first == again == space().keys(texts)
    assert np.array_equal(first.digests(), key_digests(list(space().keys(texts))))
    assert np.array_equal(again.digests(), first.digests())
    assert len(memo) == 3


def test_the_key_memo_never_answers_for_another_space():
    memo = KeyMemo()
    memo.keys(space(), ["shared text"])
    other = space(prompt="q: ")
    assert memo.keys(other, ["shared text"]) == other.keys(["shared text"]) != space().keys(["shared text"])
    assert memo.keys(space(), ["shared text"]) == space().keys(["shared text"])


def test_the_key_memo_is_bounded_and_keeps_no_long_text():
    memo = KeyMemo(max_entries=8, max_text_chars=10)
    for n in range(20):
        memo.keys(space(), [f"text {n}"])
        assert len(memo) <= 8
    assert memo.keys(space(), ["x" * 11]) == space().keys(["x" * 11]) and "x" * 11 not in memo._entries
    assert memo.keys(space(), [f"text {n}" for n in range(12)]) == space().keys([f"text {n}" for n in range(12)])
    assert len(memo) <= 8


def test_the_key_memo_refuses_what_keys_refuse():
    memo = KeyMemo()
    with pytest.raises(InvalidInputError, match="item 1"):
        memo.keys(space(), ["ok", ["not", "a", "string"]])
    with pytest.raises(InvalidInputError, match="item 0"):
        memo.keys(space(), ["\ud800"])
