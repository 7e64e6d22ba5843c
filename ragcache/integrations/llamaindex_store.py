"""A LlamaIndex vector store over one collection of the ragcache service (``BasePydanticVectorStore``), so a
``VectorStoreIndex`` keeps its nodes in the service's Milvus and queries them through ``/search``.

    >>> from llama_index.core import StorageContext, VectorStoreIndex
    >>> store = RagCacheVectorStore(client, "notes")
    >>> index = VectorStoreIndex.from_documents(documents, embed_model=RagCacheEmbedding(client=client),
    ...                                         storage_context=StorageContext.from_defaults(vector_store=store))
    >>> index.as_retriever(similarity_top_k=3).retrieve("What is a KV cache?")

The service embeds: ``add`` sends each node's text (the ``document`` prompt, through the cache) and ``query``
sends the query text (the ``query`` prompt), so the vectors LlamaIndex computed are not sent (the index still
computes them with its ``embed_model``: a ``RagCacheEmbedding`` keeps that within the service's cache too).
Each node is stored as LlamaIndex's own vector stores store it (``node_to_metadata_dict``): its metadata at the
top level, where filters find it, and the node itself (relationships, ids) under ``_node_content``, so a node comes
back as it went in. Filters are ``MetadataFilters``, turned into the service's Milvus expression.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ragcache.errors import ConfigError, InvalidInputError, NotFoundError
from ragcache.retrieval.documents import Document
from ragcache.retrieval.ranking import SearchOptions
from ragcache.retrieval.results import SearchResult

try:
    from llama_index.core.schema import BaseNode, MetadataMode, TextNode
    from llama_index.core.vector_stores.types import (
        BasePydanticVectorStore,
        FilterCondition,
        FilterOperator,
        MetadataFilter,
        MetadataFilters,
        VectorStoreQuery,
        VectorStoreQueryMode,
        VectorStoreQueryResult,
    )
    from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict
    from pydantic import PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only where llama-index-core is absent
    raise ImportError(
        "ragcache.integrations.llamaindex needs llama-index-core: pip install 'ragcache[llamaindex]' (or llama-index-core)"
    ) from exc

if TYPE_CHECKING:
    from ragcache.client import AsyncClient, Client

__all__ = ["RagCacheVectorStore", "filter_expression"]

# Milvus' operator for each LlamaIndex comparison on a metadata key.
COMPARISONS = {FilterOperator.EQ: "==", FilterOperator.NE: "!=", FilterOperator.GT: ">", FilterOperator.GTE: ">=",
               FilterOperator.LT: "<", FilterOperator.LTE: "<=", FilterOperator.IN: "in", FilterOperator.NIN: "not in"}
# Each comparison's opposite, for a negated filter.
INVERSES = {FilterOperator.EQ: FilterOperator.NE, FilterOperator.NE: FilterOperator.EQ, FilterOperator.GT: FilterOperator.LTE,
            FilterOperator.LTE: FilterOperator.GT, FilterOperator.LT: FilterOperator.GTE, FilterOperator.GTE: FilterOperator.LT,
            FilterOperator.IN: FilterOperator.NIN, FilterOperator.NIN: FilterOperator.IN}
# Milvus' JSON functions for the array operators.
ARRAY_FUNCTIONS = {FilterOperator.CONTAINS: "json_contains", FilterOperator.ANY: "json_contains_any",
                   FilterOperator.ALL: "json_contains_all"}


class RagCacheVectorStore(BasePydanticVectorStore):
    """Collection ``collection`` of the service as a LlamaIndex vector store. Give a ``Client``, an ``AsyncClient``
    (for ``async_add``/``aquery``/``adelete``), or both; with only a ``Client`` the async methods run it in a thread.
    A collection nothing was written to yet is empty (queries find nothing, deletes do nothing)."""

    stores_text: bool = True
    # The service embeds the query itself (the query prompt, through the cache): LlamaIndex need not.
    is_embedding_query: bool = False
    collection: str

    _client: Any = PrivateAttr(default=None)
    _async_client: Any = PrivateAttr(default=None)

    def __init__(self, client: Client | None, collection: str, *, async_client: AsyncClient | None = None, **kwargs: Any):
        if client is None and async_client is None:
            raise ConfigError("RagCacheVectorStore needs a Client, an AsyncClient, or both")
        super().__init__(collection=collection, **kwargs)
        self._client = client
        self._async_client = async_client

    @classmethod
    def class_name(cls) -> str:
        return "RagCacheVectorStore"

    @property
    def client(self) -> Any:
        return self._client

    # ---- writes ---------------------------------------------------------------------------------------------

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        rows = _rows(nodes)
        if rows:
            self._sync().add_documents(self.collection, rows)
        return [row["id"] for row in rows]

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        if self._async_client is None:
            return await asyncio.to_thread(self.add, nodes)
        rows = _rows(nodes)
        if rows:
            await self._async_client.add_documents(self.collection, rows)
        return [row["id"] for row in rows]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete the nodes of source document ``ref_doc_id``."""
        self.delete_nodes(filters=MetadataFilters(filters=[MetadataFilter(key="ref_doc_id", value=ref_doc_id)]))

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        if self._async_client is None:
            return await asyncio.to_thread(self.delete, ref_doc_id)
        expression = filter_expression(MetadataFilters(filters=[MetadataFilter(key="ref_doc_id", value=ref_doc_id)]))
        try:
            ids = await self._async_client.list_ids(self.collection, expression)
            if ids:
                await self._async_client.delete_documents(self.collection, ids)
        except NotFoundError as exc:
            _raise_unless_unwritten(exc)

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None, **delete_kwargs: Any) -> None:
        """Delete the nodes with these ids, or those matching ``filters``, or those both select."""
        if node_ids is None and filters is None:
            raise ConfigError("delete_nodes needs node_ids, filters, or both (clear() deletes everything)")
        client = self._sync()
        try:
            ids = list(node_ids or []) if filters is None else client.list_ids(self.collection, _where(filters, node_ids))
            if ids:
                client.delete_documents(self.collection, ids)
        except NotFoundError as exc:
            _raise_unless_unwritten(exc)

    def clear(self) -> None:
        """Drop the collection (an ``admin`` key): the store is empty again, as before its first write."""
        try:
            self._sync().drop_collection(self.collection)
        except NotFoundError as exc:
            _raise_unless_unwritten(exc)

    # ---- reads ----------------------------------------------------------------------------------------------

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The nodes with these ids (in that order, missing ones left out), or those matching ``filters``."""
        if node_ids is None and filters is None:
            raise ConfigError("get_nodes needs node_ids, filters, or both")
        client = self._sync()
        try:
            ids = list(node_ids or []) if filters is None else client.list_ids(self.collection, _where(filters, node_ids))
            return _nodes_of(client.get_documents(self.collection, ids)) if ids else []
        except NotFoundError as exc:
            _raise_unless_unwritten(exc)
            return []

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        text, arguments = _search_arguments(query)
        try:
            result = self._sync().search(text, self.collection, **arguments)
        except NotFoundError as exc:
            _raise_unless_unwritten(exc)
            result = None
        return _query_result(result)

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        if self._async_client is None:
            return await asyncio.to_thread(self.query, query)
        text, arguments = _search_arguments(query)
        try:
            result = await self._async_client.search(text, self.collection, **arguments)
        except NotFoundError as exc:
            _raise_unless_unwritten(exc)
            result = None
        return _query_result(result)

    def _sync(self) -> Client:
        if self._client is None:
            raise ConfigError("this RagCacheVectorStore has only an AsyncClient: use the async methods, or pass client=")
        return self._client


def _raise_unless_unwritten(exc: NotFoundError) -> None:
    """A collection never written reads as empty (its 404 names ``collection``); a missing model is raised."""
    if exc.field != "collection":
        raise exc


def _rows(nodes: Sequence[BaseNode]) -> list[dict[str, Any]]:
    """The service's documents for ``nodes``: the node's text, and LlamaIndex's own metadata dict of it (the node's
    metadata plus the node itself without its text and vector, so relationships come back)."""
    return [{"id": node.node_id, "text": node.get_content(metadata_mode=MetadataMode.NONE),
             "metadata": node_to_metadata_dict(node, remove_text=True, flat_metadata=False)} for node in nodes]


def _node(document_id: str, text: str, metadata: dict[str, Any]) -> BaseNode:
    if "_node_content" not in metadata:  # a document the service got from elsewhere (the CLI, another client)
        return TextNode(id_=document_id, text=text, metadata=metadata)
    return metadata_dict_to_node(metadata, text=text)


def _nodes_of(documents: Sequence[Document]) -> list[BaseNode]:
    return [_node(document.id, document.text, document.metadata) for document in documents]


def _query_result(result: SearchResult | None) -> VectorStoreQueryResult:
    hits = () if result is None else result.hits
    return VectorStoreQueryResult(nodes=[_node(hit.id, hit.text, hit.metadata) for hit in hits],
                                  similarities=[hit.score for hit in hits], ids=[hit.id for hit in hits])


def _search_arguments(query: VectorStoreQuery) -> tuple[str, dict[str, Any]]:
    """``search``'s query text and arguments for a LlamaIndex query: its top k, its filters and ids as one
    expression, its mode."""
    if not query.query_str:
        raise InvalidInputError("RagCacheVectorStore searches by the query's text (the service embeds it): "
                                "the query has only an embedding", field="query_str")
    clauses = []
    if query.filters is not None:
        clauses.append(filter_expression(query.filters))
    if query.doc_ids:
        clauses.append(f'metadata["ref_doc_id"] in {json.dumps(list(query.doc_ids))}')
    if query.node_ids:
        clauses.append(f"id in {json.dumps(list(query.node_ids))}")
    expression = " and ".join(f"({clause})" for clause in clauses) or None
    return query.query_str, {"top_k": query.similarity_top_k, "filter": expression, "options": _options(query)}


def _options(query: VectorStoreQuery) -> SearchOptions | None:
    mode = VectorStoreQueryMode(query.mode)
    if mode == VectorStoreQueryMode.DEFAULT:
        return None
    if mode in (VectorStoreQueryMode.TEXT_SEARCH, VectorStoreQueryMode.SPARSE):
        return SearchOptions(mode="keyword")
    if mode == VectorStoreQueryMode.HYBRID:
        # LlamaIndex's alpha: 0 keyword only, 1 vector only; the service's weighted fusion weighs dense by dense_weight.
        return SearchOptions(mode="hybrid") if query.alpha is None else SearchOptions(mode="hybrid", fusion="weighted",
                                                                                       dense_weight=query.alpha)
    if mode == VectorStoreQueryMode.MMR:
        return SearchOptions(mmr_lambda=0.5 if query.mmr_threshold is None else query.mmr_threshold)
    raise InvalidInputError(f"query mode {mode.value!r} is not one the service has: use default, text_search, hybrid or mmr",
                            field="mode")


def _where(filters: MetadataFilters, node_ids: list[str] | None) -> str:
    expression = filter_expression(filters)
    return expression if not node_ids else f"({expression}) and id in {json.dumps(list(node_ids))}"


def filter_expression(filters: MetadataFilters, *, negate: bool = False) -> str:
    """The service's filter (a Milvus expression over the documents' JSON ``metadata``) for LlamaIndex filters:
    ``MetadataFilter(key="topic", value="db")`` is ``metadata["topic"] == "db"``; nested filters and the and/or
    conditions as written. ``not`` is pushed down to the comparisons (De Morgan: ``not (a and b)`` is ``a' or b'``,
    each comparison inverted), as Milvus Lite cannot run ``not`` over a JSON comparison."""
    condition = FilterCondition(filters.condition or FilterCondition.AND)
    if condition == FilterCondition.NOT:  # not (a and b and ...)
        condition, negate = FilterCondition.AND, not negate
    parts = [filter_expression(item, negate=negate) if isinstance(item, MetadataFilters) else _comparison(item, negate=negate)
             for item in filters.filters]
    if not parts:
        raise InvalidInputError("MetadataFilters without a filter", field="filters")
    if negate:
        condition = FilterCondition.OR if condition == FilterCondition.AND else FilterCondition.AND
    return f" {condition.value} ".join(f"({part})" for part in parts)


def _comparison(item: MetadataFilter, *, negate: bool = False) -> str:
    field = f"metadata[{json.dumps(item.key)}]"
    operator = FilterOperator(item.operator)
    value = json.dumps(item.value)  # JSON's literals are Milvus': "text", 3, 2.5, true, ["a", "b"]
    if operator in COMPARISONS:
        return f"{field} {COMPARISONS[INVERSES[operator] if negate else operator]} {value}"
    if operator in ARRAY_FUNCTIONS and not negate:
        return f"{ARRAY_FUNCTIONS[operator]}({field}, {value})"
    usable = [op.value for op in COMPARISONS] + ([] if negate else [op.value for op in ARRAY_FUNCTIONS])
    raise InvalidInputError(f"filter operator {operator.value!r} on {item.key!r} is not one the service can run"
                            f"{' negated' if negate else ''}: use {', '.join(usable)}", field="filters")
