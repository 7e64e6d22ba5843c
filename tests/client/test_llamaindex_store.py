"""The LlamaIndex vector store over a live service (real Redis, Milvus Lite, the packaged model, over HTTP with an
API key), tested with the real ``llama-index-core`` as its own vector-store integrations are: a ``VectorStoreIndex``
built over the store answering with the right node, nodes added and read back whole (metadata, relationships),
queries with metadata filters, deletes by source document. Each test writes a collection of its own."""

from __future__ import annotations

import uuid

import pytest
from llama_index.core import Document as LlamaDocument
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from ragcache.client import AsyncClient, Client
from ragcache.errors import InvalidInputError, NotFoundError
from ragcache.integrations.llamaindex import RagCacheEmbedding, RagCacheVectorStore
from ragcache.integrations.llamaindex_store import filter_expression
from tests.client.conftest import KEY

Filter = MetadataFilter
SOURCE = NodeRelationship.SOURCE

DOCUMENTS = [
    LlamaDocument(text="A KV cache keeps attention keys and values so a prefix is not computed again.", id_="kv",
                  metadata={"topic": "llm", "year": 2023}),
    LlamaDocument(text="Milvus is a database for vector similarity search.", id_="milvus",
                  metadata={"topic": "db", "year": 2019, "tags": ["a", "b"]}),
    LlamaDocument(text="An LRU cache evicts the least recently used entry first.", id_="lru", metadata={"topic": "cache", "year": 1965}),
    LlamaDocument(text="Redis keeps values in memory and expires them after a time to live.", id_="redis",
                  metadata={"topic": "db", "year": 2009}),
]
QUERY = "which entry does an LRU cache evict?"


@pytest.fixture(scope="module")
def service(keyed_service):
    return keyed_service


@pytest.fixture
def client(service):
    with Client(service.url, api_key=KEY, timeout=120) as made:
        yield made


@pytest.fixture
async def async_client(service):
    async with AsyncClient(service.url, api_key=KEY, timeout=120) as made:
        yield made


@pytest.fixture
def store(client):
    made = RagCacheVectorStore(client, f"li_{uuid.uuid4().hex}")
    yield made
    made.clear()  # the shared service keeps no test's collection


def index_over(store: RagCacheVectorStore, client: Client) -> VectorStoreIndex:
    return VectorStoreIndex.from_documents(DOCUMENTS, storage_context=StorageContext.from_defaults(vector_store=store),
                                           embed_model=RagCacheEmbedding(client=client))


def test_an_index_over_the_store_retrieves_and_answers_with_the_right_node(store, client):
    index = index_over(store, client)
    nodes = index.as_retriever(similarity_top_k=2).retrieve(QUERY)
    assert [node.node.ref_doc_id for node in nodes][0] == "lru" and len(nodes) == 2
    assert nodes[0].node.get_content() == DOCUMENTS[2].text and nodes[0].node.metadata == {"topic": "cache", "year": 1965}
    assert nodes[0].score > nodes[1].score
    # The service holds the nodes: a new index over the same collection (nothing kept in this process) finds them.
    reopened = VectorStoreIndex.from_vector_store(RagCacheVectorStore(client, store.collection),
                                                  embed_model=RagCacheEmbedding(client=client))
    response = reopened.as_query_engine(llm=MockLLM(), similarity_top_k=1).query(QUERY)
    assert [source.node.ref_doc_id for source in response.source_nodes] == ["lru"]


def test_nodes_come_back_whole(store):
    source = RelatedNodeInfo(node_id="manual", metadata={"title": "The manual"})
    first = TextNode(id_="n1", text="Error E4711 means the pump stalled.", metadata={"page": 3, "tags": ["pump", "error"]},
                     relationships={NodeRelationship.SOURCE: source, NodeRelationship.NEXT: RelatedNodeInfo(node_id="n2")},
                     excluded_embed_metadata_keys=["page"])
    second = TextNode(id_="n2", text="Restart the pump by holding the red button.", metadata={"page": 4},
                      relationships={NodeRelationship.SOURCE: source, NodeRelationship.PREVIOUS: RelatedNodeInfo(node_id="n1")})
    assert store.add([first, second]) == ["n1", "n2"]
    got = store.get_nodes(node_ids=["n2", "missing", "n1"])
    assert [node.node_id for node in got] == ["n2", "n1"]
    for original, back in zip([second, first], got):
        assert back.get_content() == original.get_content() and back.metadata == original.metadata
        assert back.relationships == original.relationships and back.ref_doc_id == "manual"
        assert back.excluded_embed_metadata_keys == original.excluded_embed_metadata_keys
    result = store.query(VectorStoreQuery(query_str="how do I restart the pump?", similarity_top_k=1))
    assert result.ids == ["n2"] and result.nodes[0].relationships == second.relationships and len(result.similarities) == 1


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (MetadataFilters(filters=[MetadataFilter(key="topic", value="db")]), {"milvus", "redis"}),
        (MetadataFilters(filters=[MetadataFilter(key="topic", value="db", operator=FilterOperator.NE)]), {"kv", "lru"}),
        (MetadataFilters(filters=[MetadataFilter(key="year", value=2009, operator=FilterOperator.GT)]), {"kv", "milvus"}),
        (MetadataFilters(filters=[MetadataFilter(key="year", value=2009, operator=FilterOperator.LTE)]), {"lru", "redis"}),
        (MetadataFilters(filters=[MetadataFilter(key="topic", value=["llm", "cache"], operator=FilterOperator.IN)]), {"kv", "lru"}),
        (MetadataFilters(filters=[MetadataFilter(key="topic", value=["llm", "cache"], operator=FilterOperator.NIN)]), {"milvus", "redis"}),
        (MetadataFilters(filters=[MetadataFilter(key="topic", value="db"), Filter(key="year", value=2010, operator=FilterOperator.LT)]),
         {"redis"}),
        (MetadataFilters(filters=[MetadataFilter(key="topic", value="llm"), MetadataFilter(key="topic", value="cache")],
                         condition=FilterCondition.OR), {"kv", "lru"}),
        (MetadataFilters(filters=[MetadataFilter(key="topic", value="db"),
                                  MetadataFilters(filters=[MetadataFilter(key="year", value=2019), MetadataFilter(key="year", value=1965)],
                                                  condition=FilterCondition.OR)]), {"milvus"}),
        (MetadataFilters(filters=[MetadataFilter(key="topic", value="db")], condition=FilterCondition.NOT), {"kv", "lru"}),
        (MetadataFilters(filters=[MetadataFilter(key="topic", value="db"), Filter(key="year", value=2010, operator=FilterOperator.LT)],
                         condition=FilterCondition.NOT), {"kv", "lru", "milvus"}),
        (MetadataFilters(filters=[MetadataFilter(key="tags", value="b", operator=FilterOperator.CONTAINS)]), {"milvus"}),
    ],
)
def test_queries_take_metadata_filters(store, client, filters, expected):
    index_over(store, client)
    result = store.query(VectorStoreQuery(query_str="cache", similarity_top_k=4, filters=filters))
    assert {node.ref_doc_id for node in result.nodes} == expected, filter_expression(filters)


def test_queries_take_doc_ids_and_modes(store, client):
    index_over(store, client)
    by_doc = store.query(VectorStoreQuery(query_str="cache", similarity_top_k=4, doc_ids=["kv", "redis"]))
    assert {node.ref_doc_id for node in by_doc.nodes} == {"kv", "redis"}
    hybrid = store.query(VectorStoreQuery(query_str="LRU evicts", similarity_top_k=1, mode=VectorStoreQueryMode.HYBRID))
    assert hybrid.nodes[0].ref_doc_id == "lru"
    with pytest.raises(InvalidInputError, match="svm"):
        store.query(VectorStoreQuery(query_str="cache", mode=VectorStoreQueryMode.SVM))
    with pytest.raises(InvalidInputError, match="text_match"):
        store.query(VectorStoreQuery(query_str="cache", filters=MetadataFilters(
            filters=[MetadataFilter(key="topic", value="d", operator=FilterOperator.TEXT_MATCH)])))


def test_delete_by_source_document_and_an_unwritten_collection(store, client):
    assert store.query(VectorStoreQuery(query_str=QUERY, similarity_top_k=2)).nodes == []  # never written: empty
    store.delete("lru")  # nothing to delete
    assert store.get_nodes(node_ids=["x"]) == []
    index = index_over(store, client)
    index.delete_ref_doc("lru")  # LlamaIndex's own delete, through the store's delete(ref_doc_id)
    found = {node.ref_doc_id for node in store.query(VectorStoreQuery(query_str=QUERY, similarity_top_k=4)).nodes}
    assert found == {"kv", "milvus", "redis"}
    store.delete_nodes(filters=MetadataFilters(filters=[MetadataFilter(key="topic", value="db")]))
    assert [node.ref_doc_id for node in store.query(VectorStoreQuery(query_str=QUERY, similarity_top_k=4)).nodes] == ["kv"]
    store.clear()
    assert store.query(VectorStoreQuery(query_str=QUERY, similarity_top_k=4)).nodes == []
    with Client(client.base_url, api_key=KEY, model="no-such-model") as other, pytest.raises(NotFoundError):
        RagCacheVectorStore(other, store.collection).query(VectorStoreQuery(query_str=QUERY))  # a missing model is raised


async def test_the_async_methods_use_the_async_client(client, async_client):
    store = RagCacheVectorStore(None, f"li_{uuid.uuid4().hex}", async_client=async_client)
    nodes = [TextNode(id_="bread", text="Bread is baked in an oven.", relationships={SOURCE: RelatedNodeInfo(node_id="food")}),
             TextNode(id_="ice", text="Ice cream is kept in a freezer.", relationships={SOURCE: RelatedNodeInfo(node_id="cold")})]
    assert await store.async_add(nodes) == ["bread", "ice"]
    result = await store.aquery(VectorStoreQuery(query_str="where is ice cream kept?", similarity_top_k=1))
    assert result.ids == ["ice"] and result.nodes[0].ref_doc_id == "cold"
    await store.adelete("cold")
    assert (await store.aquery(VectorStoreQuery(query_str="ice cream", similarity_top_k=2))).ids == ["bread"]
    index = VectorStoreIndex.from_vector_store(store, embed_model=RagCacheEmbedding(client=client, async_client=async_client))
    assert [node.node.node_id for node in await index.as_retriever(similarity_top_k=1).aretrieve("oven")] == ["bread"]
    client.drop_collection(store.collection)
