import pytest
import torch

from ragcache.errors import TierUnavailableError
from ragcache.storage.stores import open_milvus
from ragcache.tiers import MilvusTier

DIM = 8


def test_collection_is_created_on_first_use_and_persists(tmp_path):
    uri = str(tmp_path / "l3.db")
    client = open_milvus(uri)
    level = MilvusTier(client, space_id="feedfacefeedface", dim=DIM, dtype=torch.float32)
    assert not client.has_collection(level.collection)
    keys = [f"rc:feedfacefeedface:{i:032x}" for i in range(3)]
    vectors = torch.randn(3, DIM)
    level.put_many(keys, vectors)
    assert client.has_collection("rc_feedfacefeedface") and level.count() == 3
    client.close()

    reopened = MilvusTier(open_milvus(uri), space_id="feedfacefeedface", dim=DIM, dtype=torch.float32)
    hits = reopened.get_many(keys)
    assert hits.index == [0, 1, 2] and torch.equal(hits.vectors, vectors)
    reopened.client.close()


def test_upsert_replaces_by_text_hash(milvus_client):
    level = MilvusTier(milvus_client, space_id="aaaaaaaaaaaaaaaa", dim=DIM, dtype=torch.float32)
    key = "rc:aaaaaaaaaaaaaaaa:" + "1" * 32
    level.put_many([key], torch.zeros(1, DIM))
    level.put_many([key], torch.ones(1, DIM))
    assert level.count() == 1
    assert torch.equal(level.get_many([key]).vectors, torch.ones(1, DIM))


def test_a_closed_client_raises_tier_unavailable(tmp_path):
    client = open_milvus(str(tmp_path / "gone.db"))
    level = MilvusTier(client, space_id="bbbbbbbbbbbbbbbb", dim=DIM, dtype=torch.float32)
    level.put_many(["rc:bbbbbbbbbbbbbbbb:" + "2" * 32], torch.zeros(1, DIM))
    client.close()
    with pytest.raises(TierUnavailableError, match="L3"):
        level.get_many(["rc:bbbbbbbbbbbbbbbb:" + "2" * 32])
