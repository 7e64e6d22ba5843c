"""Keys no caller can collide (docs/SECURITY.md, round four): two texts built to share one xxh3-128 (the text hash of
key format 1) get two keys, and a caller who embeds one is never served the vector of the other, from L1 or L2.

The construction (the audit's): for inputs over 240 bytes, XXH3 adds each 8-byte lane word ``w`` to one accumulator
and ``lo32(w ^ s) * hi32(w ^ s)`` to another, ``s`` the public default secret's word for that stripe and lane. A word
whose high half equals the secret's makes the product zero whatever its low half, so two such words in one lane of
two stripes can carry +d and -d: every accumulator, and so the 128-bit hash, is unchanged. The secret's high halves
used here are valid UTF-8 after a lead byte, so the texts are valid strings.
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash

from ragcache.core.cache import EmbeddingCache
from ragcache.core.keys import identity_hash, text_hashes
from ragcache.tiers import MemoryTier, RedisTier

# High halves (bytes 4..7) of the default secret's words 2 and 3: lane 2 of stripe 0 reads word 2, of stripe 1 word 3.
SECRET_WORD_2_HIGH = bytes.fromhex("839097db")
SECRET_WORD_3_HIGH = bytes.fromhex("b7b3671f")


def colliding_text(first_word: str, second_word: str) -> str:
    """400 bytes of text whose lane-2 words of stripes 0 and 1 carry the two 2-letter words in their low halves."""
    body = bytearray(b" " * 400)
    body[0:16] = b"Refund of order "
    # 0xf1 (and 0xe0) lead the secret's bytes into valid UTF-8 sequences; 0x80 completes the one 0xdb opens. The
    # space keeps each word a token of its own (glued to the odd characters, the tokenizer reads one unknown word).
    body[16:25] = first_word.encode() + b" \xf1" + SECRET_WORD_2_HIGH + b"\x80"
    body[25:57] = b" Was it approved? The answer is:"
    body[80:88] = second_word.encode() + b" \xe0" + SECRET_WORD_3_HIGH
    body[88:111] = b" The manager signed it."
    return body.decode("utf-8")


FIRST, SECOND = colliding_text("no", "ok"), colliding_text("ok", "no")  # one word pair swapped: +d and -d


def test_the_two_texts_differ_and_share_one_xxh3_128():
    assert FIRST != SECOND
    assert xxhash.xxh3_128_hexdigest(FIRST.encode()) == xxhash.xxh3_128_hexdigest(SECOND.encode())


def test_they_get_two_text_hashes_and_two_identities():
    assert len(set(text_hashes([FIRST, SECOND]))) == 2
    assert identity_hash(FIRST.encode()) != identity_hash(SECOND.encode())


def test_a_caller_is_served_its_own_texts_vector_from_l1_and_l2(encoder, redis_client):
    """Caller A embeds one text; caller B, the colliding one: B gets the vector of its own text, computed."""
    tiers = [MemoryTier(1 << 20, encoder.space.dim, torch.float32),
             RedisTier(redis_client, dim=encoder.space.dim, dtype=torch.float32)]
    tiers[1].name = "L2"
    with EmbeddingCache(encoder, tiers) as cache:
        first = cache.embed_detailed([FIRST])
        second = cache.embed_detailed([SECOND])
        assert (first.served["compute"], second.served["compute"]) == (1, 1)
        own = np.asarray(encoder.encode([SECOND]), dtype=np.float32)[0]
        np.testing.assert_allclose(np.asarray(second.vectors)[0], own, atol=1e-5)
        assert not np.allclose(np.asarray(second.vectors)[0], np.asarray(first.vectors)[0], atol=1e-3)
    # A fresh process's cache over the same Redis (L1 empty): each text's own vector from L2.
    tiers = [MemoryTier(1 << 20, encoder.space.dim, torch.float32),
             RedisTier(redis_client, dim=encoder.space.dim, dtype=torch.float32)]
    tiers[1].name = "L2"
    with EmbeddingCache(encoder, tiers) as fresh:
        again = fresh.embed_detailed([SECOND, FIRST])
        assert again.served["L2"] == 2
        np.testing.assert_array_equal(np.asarray(again.vectors)[0], np.asarray(second.vectors)[0])
        np.testing.assert_array_equal(np.asarray(again.vectors)[1], np.asarray(first.vectors)[0])
