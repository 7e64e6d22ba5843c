import struct

import pytest
import redis
import torch

from ragcache.errors import TierUnavailableError
from ragcache.storage.embedded_redis import EmbeddedRedis
from ragcache.tiers import RedisTier
from ragcache.tiers.redis import HEADER, encode_value

DIM = 8


def tier(client, **options) -> RedisTier:
    return RedisTier(client, dim=DIM, dtype=options.pop("dtype", torch.float32), **options)


def test_value_layout_is_header_then_raw_vector(redis_client):
    vector = torch.arange(DIM, dtype=torch.float32)
    tier(redis_client).put_many(["k"], vector[None])
    value = redis_client.get("k")
    assert len(value) == HEADER.size + DIM * 4
    magic, version, dtype_code, dim, _ = HEADER.unpack_from(value)
    assert (magic, version, dtype_code, dim) == (b"RC", 1, 1, DIM)
    assert value[HEADER.size :] == vector.numpy().tobytes()


@pytest.mark.parametrize(
    "damage",
    [
        lambda v: v[:-1],  # truncated
        lambda v: v[:-1] + bytes([v[-1] ^ 1]),  # one flipped bit: checksum fails
        lambda v: b"XX" + v[2:],  # foreign magic
        lambda v: v[:2] + b"\x09" + v[3:],  # a future format version
        lambda v: b"[0.1, 0.2]",  # JSON from some other cache
        lambda v: b"",
    ],
)
def test_corrupt_values_are_misses_deleted_and_counted(redis_client, damage):
    level = tier(redis_client)
    level.put_many(["k", "ok"], torch.randn(2, DIM))
    redis_client.set("k", damage(redis_client.get("k")))
    hits = level.get_many(["k", "ok"])
    assert hits.index == [1]
    assert level.num_corrupt == 1
    assert redis_client.exists("k") == 0 and redis_client.exists("ok") == 1


def test_wrong_dtype_or_dim_is_a_miss(redis_client):
    tier(redis_client, dtype=torch.float16).put_many(["half"], torch.randn(1, DIM))
    RedisTier(redis_client, dim=DIM * 2, dtype=torch.float32).put_many(["wide"], torch.randn(1, DIM * 2))
    level = tier(redis_client)
    assert level.get_many(["half", "wide"]).index == [] and level.num_corrupt == 2


def test_ttl_is_set_and_refreshed_on_hit(redis_client):
    tier(redis_client, ttl_s=100).put_many(["k"], torch.randn(1, DIM))
    assert 90 < redis_client.ttl("k") <= 100
    redis_client.expire("k", 5)
    tier(redis_client, ttl_s=100).get_many(["k"])
    assert redis_client.ttl("k") <= 5  # plain reads leave the TTL alone
    assert tier(redis_client, ttl_s=100, refresh_ttl_on_hit=True).get_many(["k"]).index == [0]
    assert redis_client.ttl("k") > 90


def test_large_batches_are_chunked(redis_client):
    level = tier(redis_client, chunk_size=7)
    keys = [f"k{i}" for i in range(50)]
    vectors = torch.randn(50, DIM)
    level.put_many(keys, vectors)
    hits = level.get_many(keys + ["missing"])
    assert hits.index == list(range(50)) and torch.equal(hits.vectors, vectors)


def test_a_redis_that_is_gone_raises_tier_unavailable():
    server = EmbeddedRedis()
    client = redis.Redis.from_url(server.url, socket_timeout=0.2, socket_connect_timeout=0.2)
    level = tier(client)
    level.put_many(["k"], torch.randn(1, DIM))
    server.stop()
    with pytest.raises(TierUnavailableError, match="L2"):
        level.get_many(["k"])
    with pytest.raises(TierUnavailableError):
        level.put_many(["k"], torch.randn(1, DIM))


def test_encode_value_checksum_covers_the_vector():
    a = encode_value(b"\x00" * 32, torch.float32, DIM)
    b = encode_value(b"\x00" * 31 + b"\x01", torch.float32, DIM)
    assert struct.unpack_from("<Q", a, 8) != struct.unpack_from("<Q", b, 8)
