"""A text a provider refuses (400 without saying which) is found by sending each text of the refused request alone,
once (issue 38, item 14): the group's other requests are never sent again, no half is sent twice, and the refused text
is not sent a third time. Before, the batcher halved the refused request (its halves, their halves, ...) and a group's
members were walked alone after that: 1.66x a group's texts upstream for one refused text."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.errors import UpstreamBadResponseError
from ragcache.models.remote import OpenAIEncoder
from ragcache.models.remote.config import RemoteModel
from ragcache.tiers import MemoryTier
from tests.models.remote.loopback import LoopbackServer, Received, Reply

DIM = 4
MAX_INPUTS = 8
REFUSED = "a text the provider REFUSES"


def vector_of(text: str) -> list[float]:
    return [float(len(text)), float(sum(map(ord, text)) % 97), 1.0, 2.0]


class CountingProvider:
    """OpenAI's /embeddings on loopback: refuses (400) any request carrying ``REFUSED``, counts every text received."""

    def __init__(self):
        self.texts_received: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, request: Received) -> Reply:
        texts = request.body["input"]
        with self._lock:
            self.texts_received.extend(texts)
        if REFUSED in texts:
            return Reply(400, {"error": {"message": "an input is invalid"}})
        data = [{"object": "embedding", "index": i, "embedding": vector_of(text)} for i, text in enumerate(texts)]
        return Reply(200, {"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}})


@pytest.fixture()
def provider():
    counting = CountingProvider()
    with LoopbackServer(counting) as server:
        counting.url = server.url
        yield counting


def cache_of(provider: CountingProvider) -> EmbeddingCache:
    model = RemoteModel(name="m", provider="openai", base_url=provider.url, upstream_model="m", dimensions=DIM,
                        max_inputs=MAX_INPUTS, concurrency=2)
    levels = Levels([MemoryTier(1000 * DIM * 4, DIM, torch.float32)], dim=DIM, dtype=torch.float32, write_behind=False)
    return EmbeddingCache(OpenAIEncoder(model), levels)


def test_a_refused_text_costs_its_requests_texts_once_more_and_itself_once_more(provider):
    """Four members of 8 texts walked as one group (as the service groups concurrent requests), one text refused;
    then each member walked alone, as the service answers a failed group. Sent: the 32 texts once, the refused
    request's 8 once more (alone), the refused text once more when its member walks alone: 41 (1.28x). Before:
    32 + 14 (8, 4+4, 2+2, 1+1... the halves) + 1 = 47, and 1.66x at the audit's sizes."""
    cache = cache_of(provider)
    members = [[f"member {m} text {i}" for i in range(MAX_INPUTS)] for m in range(4)]
    members[2][5] = REFUSED
    with pytest.raises(UpstreamBadResponseError, match="answered 400"):
        cache.embed_requests(members)
    answers = []
    for texts in members:  # what the service does when a group fails (ragcache_server/embedding/groups.py)
        try:
            answers.append(cache.embed_detailed(texts))
        except UpstreamBadResponseError:
            answers.append(None)
    cache.close()
    assert [answer is None for answer in answers] == [False, False, True, False]
    for answer, texts in zip(answers, members):
        if answer is not None:
            np.testing.assert_array_equal(answer.vectors, np.array([vector_of(text) for text in texts], dtype=np.float32))
            assert answer.served["compute"] == 0  # computed in the group's walk, found in L1
    group = [text for texts in members for text in texts]
    assert sorted(provider.texts_received) == sorted(group + members[2] + [REFUSED])
    assert len(provider.texts_received) == 41


def test_each_text_of_a_refused_request_is_sent_alone_once_and_only_the_refused_one_fails(provider):
    cache = cache_of(provider)
    texts = [f"text {i}" for i in range(MAX_INPUTS)]
    texts[3] = REFUSED
    with pytest.raises(UpstreamBadResponseError):
        cache.embed(texts)
    good = texts[:3] + texts[4:]
    np.testing.assert_array_equal(cache.embed(good), np.array([vector_of(text) for text in good], dtype=np.float32))
    cache.close()
    # The whole request once, then each text alone once: nothing a third time, no half.
    assert sorted(provider.texts_received) == sorted(texts * 2)
