"""The cache end to end: the real packaged model, a real Redis, a real Milvus Lite."""

import uuid

import numpy as np
import pytest
import redis
import torch

from ragcache import Settings, Stores, build_cache, open_cache
from ragcache.models.local import ModelEncoder
from ragcache.storage.embedded_redis import EmbeddedRedis

TEXTS = ["What is a KV cache?", "Milvus stores vectors.", "naïve café 🤖", "", "a\x00b", "x " * 600]


def make_cache(encoder, redis_url, milvus_client, **settings):
    stores = Stores(redis.Redis.from_url(redis_url, socket_timeout=0.3, socket_connect_timeout=0.3), milvus_client)
    return build_cache(Settings(redis_url=redis_url, **settings), stores, encoder)


def unique_texts(n: int | None = None):
    # Milvus Lite persists for the session: a fresh suffix keeps each test's texts uncached.
    tag = uuid.uuid4().hex[:8]
    return [f"{text} [{tag}]" for text in TEXTS][:n]


def served_by_each_level(cache, texts):
    """Vectors of ``texts`` as computed, then as served by L1, L2 and L3 (the upper levels emptied)."""
    computed = cache.embed_detailed(texts)
    assert computed.served["compute"] == len(texts)
    cache.flush()
    out = {"compute": computed.vectors}
    for name, clear in [("L1", lambda: None), ("L2", cache.tiers[0].clear),
                        ("L3", lambda: (cache.tiers[0].clear(), cache.tiers[1].client.flushdb()))]:
        clear()
        result = cache.embed_detailed(texts)
        assert result.served[name] == len(texts), (name, result.served)
        out[name] = result.vectors
        cache.flush()
    return out


def test_every_level_serves_the_bits_the_model_computes(encoder, redis_url, milvus_client):
    cache = make_cache(encoder, redis_url, milvus_client)
    texts = unique_texts()
    vectors = served_by_each_level(cache, texts)
    fresh = encoder.encode(texts).numpy()
    for name, served in vectors.items():
        assert served.dtype == np.float32
        np.testing.assert_array_equal(served.view(np.uint32), fresh.view(np.uint32), err_msg=name)
    cache.close()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_levels_agree_within_rounding(dtype, encoder, redis_url, milvus_client):
    cache = make_cache(ModelEncoder(dtype=dtype), redis_url, milvus_client)
    texts = unique_texts(3)
    vectors = served_by_each_level(cache, texts)
    reference = encoder.encode(texts).numpy()
    tolerance = {"float16": 2e-2, "bfloat16": 6e-2}[dtype]
    for name, served in vectors.items():
        np.testing.assert_array_equal(served, vectors["compute"], err_msg=name)  # the levels add no error
        np.testing.assert_allclose(served.astype(np.float32), reference, atol=tolerance, err_msg=name)
    cache.close()


def test_redis_stopped_mid_run_still_gives_correct_vectors(encoder, milvus_client, caplog):
    server = EmbeddedRedis()
    cache = make_cache(encoder, server.url, milvus_client)
    before = unique_texts()
    cache.embed(before)
    cache.flush()
    server.stop()

    after = unique_texts()
    cache.tiers[0].clear()  # force the lookups down to the stopped Redis
    mixed = cache.embed_detailed(before + after)
    fresh = encoder.encode(before + after).numpy()
    np.testing.assert_array_equal(mixed.vectors, fresh)
    assert mixed.served["L3"] == len(before)  # served by Milvus while Redis is gone
    assert cache.level_states()["L2"]["up"] is False
    assert cache.stats().levels[1].errors >= len(before)
    assert sum("L2 is down" in record.message for record in caplog.records) == 1
    cache.close()


def test_corrupt_bytes_written_by_hand_are_never_served(encoder, redis_url, milvus_client, redis_client):
    cache = build_cache(Settings(redis_url=redis_url, milvus_uri="off"), Stores(redis_client, None), encoder)
    texts = unique_texts(3)
    fresh = cache.embed(texts)
    cache.flush()
    keys = cache.space.keys(texts)
    redis_client.set(keys[0], b"garbage")
    good = redis_client.get(keys[1])
    redis_client.set(keys[1], good[:-4] + b"\x00\x00\x80\x7f")  # a NaN where the last float was
    cache.tiers[0].clear()
    result = cache.embed_detailed(texts)
    np.testing.assert_array_equal(result.vectors, fresh)
    assert result.served == {"L1": 0, "L2": 1, "compute": 2}
    assert cache.tiers[1].num_corrupt == 2
    cache.close()


def test_open_cache_with_embedded_defaults(tmp_path):
    with open_cache(Settings(data_dir=tmp_path, l1_bytes=1 << 20)) as cache:
        assert [tier.name for tier in cache.tiers] == ["L1", "L2", "L3"]
        first = cache.embed_detailed(["hello world"])
        again = cache.embed_detailed(["hello world"])
        assert first.served["compute"] == 1 and again.served["L1"] == 1
        np.testing.assert_array_equal(first.vectors, again.vectors)
        embedded = cache.tiers[1].client
    with pytest.raises(redis.ConnectionError):
        embedded.ping()  # the embedded server stopped with the cache


def test_normalize_on_output_and_as_tensor(encoder, redis_url, milvus_client):
    cache = make_cache(encoder, redis_url, milvus_client, milvus_uri="off")
    texts = unique_texts(2)
    normalized = cache.embed(texts, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, rtol=1e-5)
    tensor = cache.embed(texts, as_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (2, encoder.dim)
    cache.close()


def test_an_unknown_model_is_a_clear_config_error_without_network():
    from ragcache.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot load model 'no-org/no-such-model' offline"):
        ModelEncoder("no-org/no-such-model")
