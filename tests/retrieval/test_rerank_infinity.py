"""A remote reranker that is a real, independent server: Infinity (its own venv, mk/infinity.mk) serving the
tiny cross-encoder's folder at ``/rerank`` (the Cohere shape), behind ragcache's /rerank and /search.

Without RAGCACHE_INFINITY_PYTHON (make test sets it) the tests skip, except under CI, where they fail.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from ragcache.rerank.local import CrossEncoderReranker
from ragcache.rerank.remote import RemoteReranker
from ragcache.settings import Settings
from tests.conftest import running_infinity
from tests.live_server import LiveServer

QUERY = "which sense of the word is meant?"
TEXTS = ["a financial institution that accepts deposits", "sloping land beside a body of water", "a row of keys", "x"]


@pytest.fixture(scope="module")
def infinity_reranker(tiny_cross_encoder, tmp_path_factory):
    with running_infinity(Path(tiny_cross_encoder), tmp_path_factory.mktemp("infinity-rerank")) as server:
        yield server


def test_infinity_scores_equal_the_local_cross_encoders(infinity_reranker, tiny_cross_encoder):
    pairs = [(QUERY, text) for text in TEXTS]
    remote = RemoteReranker(f"{infinity_reranker.base_url}/rerank", infinity_reranker.model_id, api="cohere")
    np.testing.assert_allclose(remote.score(pairs), CrossEncoderReranker(tiny_cross_encoder, device="cpu").score(pairs), rtol=1e-4)
    remote.close()


def test_ragcache_reranks_through_infinity_and_caches_its_scores(infinity_reranker, tiny_cross_encoder, tmp_path):
    settings = Settings(
        redis_url="off", data_dir=tmp_path, rerank_url=f"{infinity_reranker.base_url}/rerank",
        rerank_remote_model=infinity_reranker.model_id, rerank_api="cohere",
    )
    expected = CrossEncoderReranker(tiny_cross_encoder, device="cpu").score([(QUERY, text) for text in TEXTS])
    with LiveServer(settings) as live:
        first = httpx.post(live.url + "/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=60)
        assert first.status_code == 200, first.text
        assert [item["index"] for item in first.json()] == list(np.argsort(-expected, kind="stable"))
        assert first.headers["X-Cache-Compute"] == str(len(TEXTS))
        again = httpx.post(live.url + "/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=60)
        assert again.headers["X-Cache-L1"] == str(len(TEXTS)) and again.headers["X-Cache-Compute"] == "0"
        documents = [{"id": f"d{n}", "text": text} for n, text in enumerate(TEXTS)]
        assert httpx.post(live.url + "/documents", json={"collection": "infinity", "documents": documents}, timeout=60).status_code == 200
        found = httpx.post(live.url + "/search", timeout=60, json={
            "query": QUERY, "collection": "infinity", "top_k": 4, "mode": "hybrid", "rerank": {"top_n": 2}})
        assert found.status_code == 200, found.text
        assert found.json()["reranked_by"] == infinity_reranker.model_id
        assert [hit["text"] for hit in found.json()["hits"]] == [TEXTS[i] for i in np.argsort(-expected, kind="stable")[:2]]
