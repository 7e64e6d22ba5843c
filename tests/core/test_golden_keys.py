"""Cache keys pinned to fixed strings. Every stored vector (L2, L3, every replica's) is found by its key: a
change to how spaces or texts are hashed would orphan all of them at once, silently (everything becomes a
miss). If one of these fails, the change must be deliberate, and the release notes must say that every
cache starts cold. Key format 2 (BLAKE2b text hashes and space ids, ``key_format`` in the description) was such a
change: docs/SECURITY.md says why."""

from __future__ import annotations

import dataclasses

import pytest

from ragcache.models.local import ModelEncoder

TEXTS = ["hello world", "Grüße aus 東京 🙂", ""]
TEXT_HASHES = ["e9a804b2e527fd3601d2ffc0bb023cd6", "048d835d815eb32e4ef5d5c26629fa16", "cae66941d9efbd404e4d88758ea67670"]
# The packaged all-MiniLM-L6-v2 as ModelEncoder() describes it (revision: a content hash of its files).
PACKAGED = ('{"dim":384,"dtype":"float32","key_format":2,"max_seq_length":256,"model":"sentence-transformers/all-MiniLM-L6-v2",'
            '"normalize":false,"prompt":null,"revision":"6e40502c931b2974","text_normalization":null}')
SPACE_IDS = {
    "float32": "c8e0bba7234f077a",
    "float16": "408a08ea828d7ed4",
    "prompt": "0cacc0ac6797fc0c",  # prompt="query: "
    "namespace": "7481aa66b59f9a47",  # a tenant's namespace "acme"
    "onnx": "026a5bee48900036",  # the ONNX Runtime backend (ragcache.models.onnx)
    "onnx-int8": "e88cb7c6a633a201",
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
