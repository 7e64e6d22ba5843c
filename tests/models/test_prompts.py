"""Named query/document prompts (ragcache.models.prompts): the real packaged model with configured prompts, over the
library and over real HTTP (real Redis, Milvus Lite). A prompt is part of the space: the no-prompt space is
unchanged, a prompted text has keys and vectors of its own, and those vectors are sentence-transformers' own."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.levels import Levels
from ragcache.core.scope import Prompt, Scope
from ragcache.errors import ConfigError, InvalidInputError
from ragcache.models.local import PACKAGED_MODEL
from ragcache.models.prompts import known_prompts, prompt_name_of
from ragcache.settings import Settings
from ragcache.tiers import MemoryTier
from ragcache_server.state import ServiceState
from tests.errors import error_of
from tests.live_server import LiveServer

PROMPTS = {"query": "query: ", "document": "passage: "}
TEXTS = ["how do I restart the pump?", "Error E4711 means the pump stalled."]
QUERY_SCOPE = Scope(prompt=Prompt("query", "query: "))


def cache_over(encoder) -> EmbeddingCache:
    return EmbeddingCache(encoder, Levels([MemoryTier(1 << 20, encoder.space.dim, torch.float32)], dim=encoder.space.dim,
                                         dtype=torch.float32, write_behind=False))


def test_a_prompted_scope_is_sentence_transformers_with_that_prompt(encoder):
    with cache_over(encoder) as cache:
        result = cache.embed_detailed(TEXTS, scope=QUERY_SCOPE)
        plain = cache.embed_detailed(TEXTS)
        prompted_space = cache.scoped(QUERY_SCOPE).space
    expected = encoder.model.encode(TEXTS, prompt="query: ", convert_to_numpy=True)
    np.testing.assert_allclose(result.vectors, expected, rtol=1e-4, atol=1e-6)
    assert result.served["compute"] == 2 and plain.served["compute"] == 2  # one cache, a space (keys) per prompt
    assert not np.allclose(result.vectors, plain.vectors, atol=1e-3)  # the prompt changes every vector
    assert prompted_space.prompt == "query: " and prompted_space.space_id != encoder.space.space_id
    assert encoder.space.prompt is None  # the unprompted space (and its id) is as before


def test_known_prompts_overlay_configuration_on_the_models_own(encoder):
    assert known_prompts(encoder, None) == {}  # the packaged MiniLM names no prompts of its own
    assert known_prompts(encoder, PROMPTS) == PROMPTS


@pytest.mark.parametrize(
    "prompt_name, input_type, expected",
    [(None, None, None), ("query", None, "query"), (None, "search_document", "document"), ("query", "query", "query")],
)
def test_prompt_name_of_input_types(prompt_name, input_type, expected):
    assert prompt_name_of(prompt_name, input_type) == expected


@pytest.mark.parametrize("prompt_name, input_type, field", [(None, "classification", "input_type"), ("query", "document", "prompt_name")])
def test_bad_input_type_names_its_field(prompt_name, input_type, field):
    with pytest.raises(InvalidInputError) as caught:
        prompt_name_of(prompt_name, input_type)
    assert caught.value.field == field


def test_prompts_for_an_unserved_model_are_a_config_error():
    with pytest.raises(ConfigError, match="not served"):
        ServiceState.open(Settings(model_prompts={"intfloat/e5-small-v2": PROMPTS}))


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    settings = Settings(redis_url=redis_server, data_dir=tmp_path_factory.mktemp("prompts"), model_prompts={PACKAGED_MODEL: PROMPTS})
    with LiveServer(settings) as live:
        yield live


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def vectors(response):
    assert response.status_code == 200, response.text
    return np.asarray(response.json(), dtype=np.float32)


def test_embed_applies_the_named_prompt(http, encoder):
    prompted = vectors(http.post("/embed", json={"inputs": TEXTS, "prompt_name": "query", "normalize": False}))
    np.testing.assert_allclose(prompted, encoder.model.encode(TEXTS, prompt="query: "), rtol=1e-4, atol=1e-6)
    plain = vectors(http.post("/embed", json={"inputs": TEXTS, "normalize": False}))
    np.testing.assert_allclose(plain, encoder.encode(TEXTS).cpu().numpy(), rtol=1e-4, atol=1e-6)
    again = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "query", "normalize": False})
    assert again.headers["x-cache-l1"] == "2"  # the prompted space has keys (and hits) of its own
    by_type = vectors(http.post("/embed", json={"inputs": TEXTS, "input_type": "search_query", "normalize": False}))
    np.testing.assert_array_equal(by_type, prompted)


def test_openai_route_takes_input_type_and_prompt_name(http, encoder):
    body = {"input": TEXTS, "input_type": "document"}
    data = http.post("/v1/embeddings", json=body).json()["data"]
    expected = encoder.model.encode(TEXTS, prompt="passage: ")
    np.testing.assert_allclose(np.asarray([d["embedding"] for d in data]), expected, rtol=1e-4, atol=1e-6)
    named = http.post("/v1/embeddings", json={"input": TEXTS, "prompt_name": "document"}).json()["data"]
    assert [d["embedding"] for d in named] == [d["embedding"] for d in data]


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/embed", {"inputs": "x", "prompt_name": "passage"}, "prompt_name"),
        ("/embed", {"inputs": "x", "input_type": "classification"}, "input_type"),
        ("/v1/embeddings", {"input": "x", "prompt_name": "passage"}, "prompt_name"),
        ("/v1/embeddings", {"input": "x", "prompt_name": "query", "input_type": "document"}, "prompt_name"),
    ],
)
def test_unknown_prompts_are_422_naming_the_field(http, path, body, field):
    response = http.post(path, json=body)
    assert response.status_code == (400 if path.startswith("/v1/") else 422) and error_of(response)["field"] == field


def test_documents_use_the_document_prompt_and_search_the_query_prompt(http, encoder):
    documents = [{"id": str(i), "text": text} for i, text in enumerate(TEXTS)]
    assert http.post("/documents", json={"collection": "prompted", "documents": documents}).status_code == 200
    info = {c["name"]: c for c in http.get("/collections").json()["collections"]}["prompted"]
    assert info["space_id"] == Scope(prompt=Prompt("document", "passage: ")).space_of(encoder.space).space_id
    hits = http.post("/search", json={"collection": "prompted", "query": "restart the pump", "top_k": 2}).json()["hits"]
    query = encoder.model.encode(["restart the pump"], prompt="query: ")[0]
    passages = encoder.model.encode([hit["text"] for hit in hits], prompt="passage: ")
    cosine = passages @ query / (np.linalg.norm(passages, axis=1) * np.linalg.norm(query))
    assert [hit["score"] for hit in hits] == pytest.approx(cosine.tolist(), abs=1e-4)
    hybrid = http.post("/search/batch", json={"collection": "prompted", "queries": ["pump"], "mode": "hybrid"})
    assert hybrid.status_code == 200 and hybrid.json()["results"][0]["hits"]


def test_info_and_stats_show_the_prompts(http):
    models = http.get("/info").json()["models"]
    assert models[0]["prompts"] == PROMPTS
    stats = http.get("/stats").json()["models"][PACKAGED_MODEL]["prompts"]
    assert stats["query"]["space"]["prompt"] == "query: " and stats["query"]["since_start"]["texts"] >= 1


def test_python_client_embeds_under_a_prompt(server, encoder):
    from ragcache.client import Client

    with Client(server.url) as client:
        vectors = client.embed(TEXTS, prompt_name="query")
        assert client.info()["models"][0]["prompts"] == PROMPTS
    np.testing.assert_allclose(vectors, encoder.model.encode(TEXTS, prompt="query: "), rtol=1e-4, atol=1e-6)


class PlainEncoder:
    """An encoder without sentence-transformers' prompt argument (as a remote provider's): records its texts."""

    def __init__(self, encoder):
        self.space, self.device, self.texts = encoder.space, encoder.device, []

    def encode(self, texts):
        self.texts.extend(texts)
        return torch.zeros((len(texts), self.space.dim))


def test_an_encoder_without_prompt_support_gets_the_prompt_prepended(encoder):
    plain = PlainEncoder(encoder)
    with cache_over(plain) as cache:
        cache.embed(TEXTS, scope=QUERY_SCOPE)
    assert plain.texts == ["query: " + text for text in TEXTS]
