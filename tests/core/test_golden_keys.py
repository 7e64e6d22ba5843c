"""Cache keys pinned to fixed strings. Every stored vector (L2, L3, every replica's) is found by its key: a
change to how spaces or texts are hashed would orphan all of them at once, silently (everything becomes a
miss). If one of these fails, the change must be deliberate, and the release notes must say that every
cache starts cold."""

from __future__ import annotations

import dataclasses

import pytest

from ragcache.models.local import ModelEncoder

TEXTS = ["hello world", "Grüße aus 東京 🙂", ""]
TEXT_HASHES = ["df8d09e93f874900a99b8775cc15b6c7", "2eebac9a94ca2835acf4e4939ec6b0ea", "99aa06d3014798d86001c324468d497f"]
# The packaged all-MiniLM-L6-v2 as ModelEncoder() describes it (revision: a content hash of its files).
PACKAGED = ('{"dim":384,"dtype":"float32","max_seq_length":256,"model":"sentence-transformers/all-MiniLM-L6-v2",'
            '"normalize":false,"prompt":null,"revision":"6e40502c931b2974","text_normalization":null}')
SPACE_IDS = {
    "float32": "97d7212f435af461",
    "float16": "4537ed02b6753a79",
    "prompt": "540ed1d59c66bab6",  # prompt="query: "
    "namespace": "ff0e38a22c9faf31",  # a tenant's namespace "acme"
    "onnx": "6235b720368dd917",  # the ONNX Runtime backend (ragcache.models.onnx)
    "onnx-int8": "1a80441418d96b70",
}


def spaces(packaged):
    return {
        "float32": packaged,
        "float16": dataclasses.replace(packaged, dtype="float16"),
        "prompt": dataclasses.replace(packaged, prompt="query: "),
        "namespace": dataclasses.replace(packaged, namespace="acme"),
        "onnx": dataclasses.replace(packaged, backend="onnx"),
        "onnx-int8": dataclasses.replace(packaged, backend="onnx-int8"),
    }


def test_the_packaged_model_describes_the_same_space(encoder):
    assert encoder.space.canonical() == PACKAGED


@pytest.mark.parametrize("variant", sorted(SPACE_IDS))
def test_golden_keys(encoder, variant):
    space = spaces(encoder.space)[variant]
    expected = [f"rc:{SPACE_IDS[variant]}:{digest}" for digest in TEXT_HASHES]
    assert space.keys(space.prepare(TEXTS)) == expected


def test_an_encoder_built_with_a_dtype_and_prompt_has_the_pinned_space():
    built = ModelEncoder(dtype="float16", prompt="query: ").space
    assert dataclasses.replace(built, prompt=None).space_id == SPACE_IDS["float16"]
    assert dataclasses.replace(built, dtype="float32").space_id == SPACE_IDS["prompt"]
