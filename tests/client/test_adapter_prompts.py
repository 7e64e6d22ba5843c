"""Prompts through every adapter (issue 39.3), over a live service whose model has ``query``/``document`` prompts:
the adapters' query vectors are the ones ``/search`` embeds a query with, and their document vectors the ones
``/documents`` stored in Milvus, bit for bit through the cache (``ragcache.client``, LangChain's
``RagCacheEmbeddings``, LlamaIndex's ``RagCacheEmbedding``; sync and async). Without the input types the adapters
got vectors of neither space."""

from __future__ import annotations

import numpy as np
import pytest

from ragcache.client import AsyncClient, Client
from ragcache.core.scope import Prompt, Scope
from ragcache.integrations.langchain import RagCacheEmbeddings
from ragcache.integrations.llamaindex import RagCacheEmbedding
from ragcache.models.local import PACKAGED_MODEL
from ragcache.retrieval import CollectionName
from ragcache.settings import Settings
from tests.live_server import LiveServer

PROMPTS = {"query": "query: ", "document": "passage: "}
DOCUMENTS = [
    {"id": "stall", "text": "Error E4711 means the pump stalled."},
    {"id": "restart", "text": "Restart the pump by holding the red button for five seconds."},
    {"id": "filter", "text": "Change the water filter every six months."},
]
TEXTS = [document["text"] for document in DOCUMENTS]
QUERY = "how do I restart the pump?"


@pytest.fixture(scope="module")
def service(redis_server, tmp_path_factory):
    settings = Settings(redis_url=redis_server, data_dir=tmp_path_factory.mktemp("adapter-prompts"),
                        model_prompts={PACKAGED_MODEL: PROMPTS})
    with LiveServer(settings) as live:
        with Client(live.url, timeout=120) as client:
            client.add_documents("manual", DOCUMENTS)
        yield live


@pytest.fixture
def client(service):
    with Client(service.url, timeout=120) as made:
        yield made


def stored_vectors(service) -> np.ndarray:
    """The vectors ``/documents`` wrote to Milvus, in DOCUMENTS' order (read from the service's own store)."""
    catalog = service.state.knowledge.catalog
    meta = catalog.lookup(CollectionName.of("manual"))
    rows = catalog.call(meta, "query", meta.milvus_name, filter='id in ["stall", "restart", "filter"]', output_fields=["id", "vector"])
    by_id = {row["id"]: np.asarray(row["vector"], dtype=np.float32) for row in rows}
    return np.stack([by_id[document["id"]] for document in DOCUMENTS])


def search_query_vector(service, client: Client) -> np.ndarray:
    """The vector ``/search`` embedded ``QUERY`` with: a search, then the service's query-prompted cache, which
    answers from its first level (nothing computed), i.e. with the vector that search computed."""
    client.search(QUERY, "manual", top_k=1)
    cache = service.state.caches[PACKAGED_MODEL]
    result = cache.embed_detailed([QUERY], scope=Scope(prompt=Prompt("query", PROMPTS["query"])))
    assert result.served.get("compute", 0) == 0, result.served
    return np.asarray(result.vectors[0], dtype=np.float32)


def test_the_spaces_differ(service, client):
    """The premise: with this model, a text's query, document and plain vectors are three different vectors."""
    query, document, plain = (client.embed([TEXTS[0]], input_type=kind)[0] for kind in ("query", "document", None))
    assert not np.array_equal(query, document) and not np.array_equal(document, plain) and not np.array_equal(query, plain)


def test_document_vectors_are_what_documents_stored(service, client):
    stored = stored_vectors(service)
    np.testing.assert_array_equal(client.embed(TEXTS, input_type="document"), stored)
    np.testing.assert_array_equal(np.asarray(RagCacheEmbeddings(client).embed_documents(TEXTS), dtype=np.float32), stored)
    llama = RagCacheEmbedding(client=client)
    np.testing.assert_array_equal(np.asarray(llama.get_text_embedding_batch(TEXTS), dtype=np.float32), stored)
    np.testing.assert_array_equal(np.asarray(llama.get_text_embedding(TEXTS[1]), dtype=np.float32), stored[1])


def test_query_vectors_are_what_search_embeds(service, client):
    expected = search_query_vector(service, client)
    np.testing.assert_array_equal(client.embed([QUERY], input_type="query")[0], expected)
    np.testing.assert_array_equal(np.asarray(RagCacheEmbeddings(client).embed_query(QUERY), dtype=np.float32), expected)
    np.testing.assert_array_equal(np.asarray(RagCacheEmbedding(client=client).get_query_embedding(QUERY), dtype=np.float32), expected)
    # And /search's scores are the cosines of the adapter's query vector with the stored document vectors.
    stored = dict(zip([d["id"] for d in DOCUMENTS], stored_vectors(service)))
    for hit in client.search(QUERY, "manual", top_k=3).hits:
        cosine = stored[hit.id] @ expected / (np.linalg.norm(stored[hit.id]) * np.linalg.norm(expected))
        assert hit.score == pytest.approx(float(cosine), abs=1e-5)


async def test_the_async_adapters_too(service, client):
    expected_query, stored = search_query_vector(service, client), stored_vectors(service)
    async with AsyncClient(service.url, timeout=120) as async_client:
        langchain = RagCacheEmbeddings(async_client=async_client)
        np.testing.assert_array_equal(np.asarray(await langchain.aembed_query(QUERY), dtype=np.float32), expected_query)
        np.testing.assert_array_equal(np.asarray(await langchain.aembed_documents(TEXTS), dtype=np.float32), stored)
        llama = RagCacheEmbedding(async_client=async_client)
        np.testing.assert_array_equal(np.asarray(await llama.aget_query_embedding(QUERY), dtype=np.float32), expected_query)
        np.testing.assert_array_equal(np.asarray(await llama.aget_text_embedding_batch(TEXTS), dtype=np.float32), stored)
    # With only a Client, the async methods run it in a thread: the same vectors.
    np.testing.assert_array_equal(np.asarray(await RagCacheEmbeddings(client).aembed_query(QUERY), dtype=np.float32), expected_query)
    np.testing.assert_array_equal(np.asarray(await RagCacheEmbedding(client=client).aget_query_embedding(QUERY), dtype=np.float32),
                                  expected_query)
