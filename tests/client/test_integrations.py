"""LangChain and LlamaIndex over a real service: the adapters with the real ``langchain-core`` and
``llama-index-core`` interfaces, through ragcache.client (sync and async) with an API key, against a live
service with real Redis, Milvus Lite and the model."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStoreRetriever
from llama_index.core import Document as LlamaDocument
from llama_index.core import VectorStoreIndex

from ragcache.client import AsyncClient, Client
from ragcache.errors import AuthenticationError, ConfigError, NotFoundError, ServiceUnavailableError
from ragcache.integrations.langchain import RagCacheRetriever, RagCacheVectorStore
from ragcache.integrations.llamaindex import RagCacheEmbedding
from ragcache.integrations.llamaindex import RagCacheRetriever as LlamaRetriever
from ragcache.retrieval.ranking import SearchOptions
from ragcache.storage.processes import free_port
from tests.client.conftest import KEY

DOCUMENTS = [
    {"id": "kv", "text": "A KV cache keeps attention keys and values so a prefix is not computed again.", "metadata": {"topic": "llm"}},
    {"id": "milvus", "text": "Milvus is a database for vector similarity search.", "metadata": {"topic": "db"}},
    {"id": "lru", "text": "An LRU cache evicts the least recently used entry first.", "metadata": {"topic": "cache"}},
    {"id": "redis", "text": "Redis keeps values in memory and expires them after a time to live.", "metadata": {"topic": "db"}},
]
QUERY = "which entry does an LRU cache evict?"


@pytest.fixture(scope="module")
def server(keyed_service):
    with Client(keyed_service.url, api_key=KEY, timeout=120) as client:
        client.add_documents("notes", DOCUMENTS)
    return keyed_service


@pytest.fixture
def client(server):
    with Client(server.url, api_key=KEY, timeout=120) as made:
        yield made


@pytest.fixture
async def async_client(server):
    async with AsyncClient(server.url, api_key=KEY, timeout=120) as made:
        yield made


# ---- LangChain ----------------------------------------------------------------------------------------------

def test_langchain_retriever_returns_the_search_hits_as_documents(client):
    expected = client.search(QUERY, "notes", top_k=2).hits
    documents = RagCacheRetriever(client=client, collection="notes", top_k=2).invoke(QUERY)
    assert all(isinstance(document, Document) for document in documents)
    assert [document.id for document in documents] == [hit.id for hit in expected] and documents[0].id == "lru"
    assert documents[0].page_content == DOCUMENTS[2]["text"]
    assert documents[0].metadata == {"topic": "cache"}  # as stored: no score key added


def test_retrievers_take_search_options(client):
    """Hybrid search through both frameworks' retrievers: the same hits as the client's own search."""
    options = SearchOptions(mode="hybrid")
    expected = [hit.id for hit in client.search("LRU evicts", "notes", top_k=3, options=options).hits]
    assert [d.id for d in RagCacheRetriever(client=client, collection="notes", top_k=3, options=options).invoke("LRU evicts")] == expected
    assert [n.node.node_id for n in LlamaRetriever(client, "notes", top_k=3, options=options).retrieve("LRU evicts")] == expected
    keyword = RagCacheRetriever(client=client, collection="notes", options=SearchOptions(mode="keyword")).invoke("LRU")
    assert [d.id for d in keyword] == ["lru"]


async def test_langchain_retriever_async_with_a_filter(async_client):
    retriever = RagCacheRetriever(async_client=async_client, collection="notes", top_k=4, filter='metadata["topic"] == "db"')
    documents = await retriever.ainvoke("where are vectors stored?")
    assert {document.id for document in documents} == {"milvus", "redis"}


def test_langchain_vector_store_adds_searches_and_deletes(client):
    store = RagCacheVectorStore(client, "lc-store")
    ids = store.add_texts(["Paris is the capital of France.", "Tokyo is the capital of Japan."],
                          metadatas=[{"country": "fr"}, {"country": "jp"}], ids=["paris", "tokyo"])
    assert ids == ["paris", "tokyo"]
    scored = store.similarity_search_with_score("capital of Japan", k=2)
    assert [document.id for document, _ in scored] == ["tokyo", "paris"] and scored[0][1] > scored[1][1]
    assert store.similarity_search("capital", k=2, filter='metadata["country"] == "fr"')[0].id == "paris"
    relevance = store.similarity_search_with_relevance_scores("capital of Japan", k=1)
    assert 0 <= relevance[0][1] <= 1
    retriever = store.as_retriever(search_kwargs={"k": 1})
    assert isinstance(retriever, VectorStoreRetriever) and retriever.invoke("Japan")[0].id == "tokyo"
    generated = store.add_texts(["Rome is the capital of Italy."])
    assert len(generated) == 1 and len(generated[0]) == 32
    store.delete(["tokyo"])
    assert "tokyo" not in [document.id for document in store.similarity_search("capital of Japan", k=3)]
    np.testing.assert_allclose(store.embeddings.embed_query("Rome"), client.embed(["Rome"])[0], rtol=1e-5, atol=1e-6)


async def test_langchain_vector_store_async(client, async_client):
    store = RagCacheVectorStore.from_texts(["Bread is baked in an oven."], ids=["bread"], client=client, collection="lc-async")
    store.async_client = async_client
    await store.aadd_texts(["Ice cream is kept in a freezer."], ids=["ice"])
    documents = await store.asimilarity_search("where is ice cream kept?", k=1)
    assert documents[0].id == "ice"
    await store.adelete(["ice"])
    assert [document.id for document in await store.asimilarity_search("ice cream", k=2)] == ["bread"]


def test_langchain_raises_the_clients_errors(server):
    with Client(server.url, api_key="wrong-key-0123456789", retries=0) as wrong:
        with pytest.raises(AuthenticationError):
            RagCacheRetriever(client=wrong, collection="notes").invoke(QUERY)
        with pytest.raises(AuthenticationError):
            RagCacheVectorStore(wrong, "notes").similarity_search(QUERY)
    # Nothing listens there: the client retries, then raises its own error (not httpx's).
    with Client(f"http://127.0.0.1:{free_port()}", api_key=KEY, retries=1, backoff_s=0.01) as down:
        with pytest.raises(ServiceUnavailableError):
            RagCacheRetriever(client=down, collection="notes").invoke(QUERY)
    with pytest.raises(ConfigError):
        RagCacheRetriever(collection="notes")


def test_a_missing_collection_is_a_404_naming_the_field_and_the_existing_ones(server, client):
    """The service's 404 says which thing is missing (``field``), and for a collection, which ones exist."""
    headers = {"Authorization": f"Bearer {KEY}"}
    for path, body in [("/search", {"collection": "nots", "query": "q"}), ("/documents/get", {"collection": "nots", "ids": ["a"]}),
                       ("/search/batch", {"collection": "nots", "queries": ["q"]}), ("/documents/ids", {"collection": "nots"})]:
        answer = httpx.post(server.url + path, json=body, headers=headers, timeout=60)
        assert answer.status_code == 404, (path, answer.text)
        error = answer.json()["error"]
        assert error["field"] == "collection" and "'nots' does not exist" in error["message"], path
        assert "existing collections:" in error["message"] and "'notes'" in error["message"], path
    missing_model = httpx.post(server.url + "/search", json={"collection": "notes", "query": "q", "model": "no-such-model"},
                               headers=headers, timeout=60)
    assert missing_model.status_code == 404 and missing_model.json()["error"]["field"] == "model"
    with pytest.raises(NotFoundError) as caught:
        client.search("q", "nots")
    assert caught.value.field == "collection"


def test_langchain_store_over_an_unwritten_collection_is_empty_but_a_missing_model_raises(server, client):
    store = RagCacheVectorStore(client, "lc-never-written")
    assert store.similarity_search("anything", k=3) == [] and store.similarity_search_with_score("anything") == []
    assert store.get_by_ids(["a", "b"]) == [] and store.delete(["a"]) is True
    assert RagCacheRetriever(client=client, collection="lc-never-written").invoke("anything") == []
    with Client(server.url, api_key=KEY, model="no-such-model", timeout=120) as other_model:
        with pytest.raises(NotFoundError) as caught:
            RagCacheVectorStore(other_model, "notes").similarity_search("anything")
    assert caught.value.field == "model"


def test_langchain_store_keeps_metadata_and_takes_partial_ids(client):
    store = RagCacheVectorStore(client, "lc-partial")
    ids = store.add_documents([Document(page_content="The owl hunts at night.", metadata={"score": "mine", "n": 1}, id="owl"),
                               Document(page_content="The lark sings at dawn.", metadata={"n": 2})])
    assert ids[0] == "owl" and ids[1] and ids[1] != "owl"
    found = store.get_by_ids([ids[1], "missing", "owl"])
    assert [(d.id, d.metadata) for d in found] == [(ids[1], {"n": 2}), ("owl", {"score": "mine", "n": 1})]
    (best, score), _ = store.similarity_search_with_score("which bird hunts at night?", k=2)
    assert best.id == "owl" and best.metadata == {"score": "mine", "n": 1} and 0 < score <= 1  # the user's own "score" key
    retriever = RagCacheRetriever(client=client, collection="lc-partial", top_k=1)
    assert len(retriever.invoke("bird")) == 1 and len(retriever.invoke("bird", k=2)) == 2 and len(retriever.invoke("bird", top_k=2)) == 2


def test_a_401_names_the_clients_own_way_to_pass_a_key(server):
    with Client(server.url, retries=0) as keyless, pytest.raises(AuthenticationError) as caught:
        keyless.search(QUERY, "notes")
    assert "Client(api_key=...)" in str(caught.value) and "Authorization" not in str(caught.value)


# ---- LlamaIndex ---------------------------------------------------------------------------------------------

def test_llamaindex_embedding_matches_the_service(client):
    embed_model = RagCacheEmbedding(client=client)
    texts = ["What is a KV cache?", "Milvus stores vectors"]
    np.testing.assert_array_equal(np.array(embed_model.get_text_embedding_batch(texts), dtype=np.float32), client.embed(texts))
    np.testing.assert_array_equal(np.array(embed_model.get_query_embedding(texts[0]), dtype=np.float32), client.embed(texts[:1])[0])


async def test_llamaindex_embedding_async(client, async_client):
    embed_model = RagCacheEmbedding(async_client=async_client)
    vectors = await embed_model.aget_text_embedding_batch(["one text", "another text"])
    np.testing.assert_array_equal(np.array(vectors, dtype=np.float32), client.embed(["one text", "another text"]))
    query_vector = await embed_model.aget_query_embedding("one text")
    np.testing.assert_array_equal(np.array(query_vector, dtype=np.float32), client.embed(["one text"])[0])


def test_llamaindex_vector_store_index_built_with_the_embedding(client):
    # LlamaIndex's own in-memory index, embedding every node and the query through the service.
    documents = [LlamaDocument(text=document["text"], id_=document["id"]) for document in DOCUMENTS]
    index = VectorStoreIndex.from_documents(documents, embed_model=RagCacheEmbedding(client=client))
    nodes = index.as_retriever(similarity_top_k=1).retrieve(QUERY)
    assert nodes[0].node.ref_doc_id == "lru"


def test_llamaindex_retriever_returns_the_search_hits_as_nodes(client):
    expected = client.search(QUERY, "notes", top_k=3).hits
    nodes = LlamaRetriever(client, "notes", top_k=3).retrieve(QUERY)
    assert [node.node.node_id for node in nodes] == [hit.id for hit in expected]
    assert nodes[0].node.get_content() == DOCUMENTS[2]["text"] and nodes[0].node.metadata == {"topic": "cache"}
    assert nodes[0].score == pytest.approx(expected[0].score)


async def test_llamaindex_retriever_async_with_a_filter(async_client):
    retriever = LlamaRetriever(None, "notes", async_client=async_client, top_k=4, filter='metadata["topic"] == "db"')
    nodes = await retriever.aretrieve("where are vectors stored?")
    assert {node.node.node_id for node in nodes} == {"milvus", "redis"}


def test_llamaindex_raises_the_clients_errors(server):
    with Client(server.url, api_key="wrong-key-0123456789", retries=0) as wrong:
        with pytest.raises(AuthenticationError):
            LlamaRetriever(wrong, "notes").retrieve(QUERY)
        with pytest.raises(AuthenticationError):
            RagCacheEmbedding(client=wrong).get_query_embedding(QUERY)
    with pytest.raises(ConfigError):
        RagCacheEmbedding()
