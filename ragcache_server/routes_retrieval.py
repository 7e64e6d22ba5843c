"""/documents, /collections and /search over the knowledge base, each caller within its tenant.

A tenant's collections are stored under a tenant prefix (``ragcache.retrieval.names``): each route names its
collection as a ``CollectionName`` (the caller's name and the stored one), and the knowledge base's errors say the
caller's, so a tenant never sees, nor can name, another tenant's collection.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request

from ragcache import InvalidInputError, NotFoundError, TierUnavailableError
from ragcache.models import DOCUMENT, QUERY
from ragcache.prefixes import Prefix, PrefixName, PrefixRegistry, assemble_prompt, render_text
from ragcache.rerank import RerankCache, rerank_result
from ragcache.retrieval import (
    FILTER_EXAMPLE,
    CollectionName,
    KnowledgeBase,
    SearchResult,
    SyncOptions,
    own_named,
    public_name,
    tenant_prefix,
)
from ragcache_server.answers import SEARCH_ADVICE, check_answer_bytes, documents_within, fill_texts, may_pass, without_texts
from ragcache_server.auth import principal_of
from ragcache_server.deps import blocking, cache_of, check_count, check_text_size, prefixes_of, rerank_scope, state_of
from ragcache_server.errors import HTTPError
from ragcache_server.responses import JSONResponse
from ragcache_server.schemas import (
    AddDocumentsRequest,
    BatchSearchRequest,
    CollectionPath,
    DeleteDocumentsRequest,
    GetDocumentsRequest,
    ListIdsRequest,
    SearchRequest,
)
from ragcache_server.state import ServiceState

router = APIRouter(tags=["retrieval"])


def knowledge_of(state: ServiceState) -> KnowledgeBase:
    if state.knowledge is None:
        raise HTTPError(503, "retrieval needs Milvus, which is off: set RAGCACHE_MILVUS_URI", type="unavailable")
    return state.knowledge


# A missing collection's 404 lists this many of the caller's collections at most (a listing, not a dump).
MAX_NAMES_LISTED = 20


@contextlib.asynccontextmanager
async def naming_existing_collections(request: Request) -> AsyncIterator[None]:
    """A missing collection's 404 (``field: "collection"``) lists the caller's existing collections, so a typo
    shows itself; a missing model's 404 (``field: "model"``) passes as it is."""
    try:
        yield
    except NotFoundError as exc:
        if exc.field != "collection":
            raise
        tenant = principal_of(request).tenant
        stored = await blocking(knowledge_of(state_of(request)).collection_names, prefix=tenant_prefix(tenant))
        names = sorted(name for name in (public_name(tenant, item) for item in stored) if name is not None)
        shown = ", ".join(repr(name) for name in names[:MAX_NAMES_LISTED]) + (" ..." if len(names) > MAX_NAMES_LISTED else "")
        existing = f"existing collections: {shown}" if names else "no collection exists yet (POST /documents creates one)"
        raise NotFoundError(f"{exc}; {existing}", field="collection") from exc


@router.post("/documents", summary="Add or replace documents (upsert by id)")
async def add_documents(body: AddDocumentsRequest, request: Request) -> JSONResponse:
    state = state_of(request)
    check_count(body.documents, "documents", state.settings.service.max_batch)
    name = CollectionName.of(body.collection, principal_of(request).tenant)
    cache = cache_of(request, body.model, DOCUMENT, optional=True)
    documents = [document.model_dump() for document in body.documents]
    sync = None
    if body.sync is not None:
        # A sync deletes documents, which DELETE /documents reserves for admin keys: the same rule here.
        if "admin" not in principal_of(request).scopes:
            raise HTTPError(403, "sync deletes documents, which needs the 'admin' scope", field="sync", type="forbidden")
        sync = SyncOptions(body.sync.cleanup, body.sync.scope)
    tenant, quota = principal_of(request).tenant, state.settings.access.tenant_max_collections
    if tenant is not None and quota is not None:
        await blocking(check_collection_quota, knowledge_of(state), tenant, name, quota)
    result = await blocking(knowledge_of(state).add_documents, name, documents, cache=cache, sync=sync)
    return JSONResponse(result)


def check_collection_quota(knowledge: KnowledgeBase, tenant: str, name: CollectionName, quota: int) -> None:
    """403 when an ingest would create one collection more than the tenant may have. Checked per request,
    not under a lock: two first ingests racing into new collections may pass it together (one over)."""
    names = knowledge.collection_names(prefix=tenant_prefix(tenant))
    if name.stored not in names and len(names) >= quota:
        message = (f"collection {name.public!r} would be this tenant's {len(names) + 1}th, over its quota of {quota} "
                   "(RAGCACHE_TENANT_MAX_COLLECTIONS): ingest into an existing collection, or delete one")
        raise HTTPError(403, message, field="collection", type="quota_exceeded")


@router.post("/documents/ids", summary="The ids of a collection's documents (optionally filtered), for syncing")
async def list_ids(body: ListIdsRequest, request: Request) -> JSONResponse:
    name = CollectionName.of(body.collection, principal_of(request).tenant)
    async with naming_existing_collections(request):
        ids = await blocking(knowledge_of(state_of(request)).list_ids, name, body.filter)
    return JSONResponse({"collection": body.collection, "ids": ids})


@router.post("/documents/get", summary="Documents by id (text and metadata)")
async def get_documents(body: GetDocumentsRequest, request: Request) -> JSONResponse:
    """``{"collection", "documents": [{id, text, metadata}], "missing": [ids]}``, documents in the order asked."""
    state = state_of(request)
    check_count(body.ids, "ids", state.settings.service.max_batch)
    name = CollectionName.of(body.collection, principal_of(request).tenant)
    async with naming_existing_collections(request):
        documents = await blocking(documents_within, knowledge_of(state), name, body.ids, state.settings.service.max_answer_bytes)
    found = {document.id for document in documents}
    missing = [doc_id for doc_id in dict.fromkeys(body.ids) if doc_id not in found]
    return JSONResponse({"collection": body.collection, "documents": documents, "missing": missing})


@router.delete("/collections/{collection}", summary="Drop a collection and all its documents")
async def drop_collection(collection: CollectionPath, request: Request) -> JSONResponse:
    """404 when it does not exist (for a tenant: when it is not the tenant's)."""
    name = CollectionName.of(collection, principal_of(request).tenant)
    async with naming_existing_collections(request):
        await blocking(knowledge_of(state_of(request)).drop_collection, name)
    return JSONResponse({"collection": collection, "dropped": True})


@router.delete("/documents", summary="Delete documents by id")
async def delete_documents(body: DeleteDocumentsRequest, request: Request) -> JSONResponse:
    state = state_of(request)
    check_count(body.ids, "ids", state.settings.service.max_batch)
    name = CollectionName.of(body.collection, principal_of(request).tenant)
    async with naming_existing_collections(request):
        num_deleted = await blocking(knowledge_of(state).delete_documents, name, body.ids)
    return JSONResponse({"collection": body.collection, "num_deleted": num_deleted})


@router.get("/collections", summary="Collections with their embedding space and size")
async def list_collections(request: Request) -> JSONResponse:
    tenant = principal_of(request).tenant
    # Only the tenant's own collections are read: another tenant's broken one cannot fail this listing.
    infos = await blocking(knowledge_of(state_of(request)).list_collections, prefix=tenant_prefix(tenant))
    return JSONResponse({"collections": own_named(tenant, infos)})


@router.post("/search", summary="The documents nearest to a query (dense, keyword or hybrid)")
async def search(body: SearchRequest, request: Request) -> JSONResponse:
    """``X-Search-Mode`` names the mode that answered; ``X-Search-Fallback: dense`` (and the body's
    ``fallback``) says that a keyword or hybrid search was answered by dense search alone. With ``rerank``,
    ``X-Rerank`` names the reranker that ordered the hits, or ``X-Rerank-Fallback: search-order`` (and the
    body's ``rerank_fallback``) says that it failed and the hits are in search order. With ``include_text:
    false`` the hits carry no ``text``; an answer over ``max_answer_bytes`` is a 413."""
    async with naming_existing_collections(request):
        return await answer_search(body, request)


async def answer_search(body: SearchRequest, request: Request) -> JSONResponse:
    state = state_of(request)
    check_text_size(body.query, "query", state.settings.service.max_text_bytes)
    reranker = reranker_of(state, body)
    name = CollectionName.of(body.collection, principal_of(request).tenant)
    cache, knowledge = cache_of(request, body.model, DOCUMENT, optional=True), knowledge_of(state)
    query_cache = cache_of(request, body.model, QUERY, optional=True)
    arguments: dict[str, Any] = dict(cache=cache, query_cache=query_cache, top_k=body.top_k, filter=body.filter, options=body.options())
    with_text = reads_texts_with_hits(body, 1, state)
    # The filter is Milvus' expression language over this one collection's fields; it cannot name another
    # collection, and tenants are kept apart by collection, so no filter reaches another tenant's documents.
    # A repeated query's result list comes from Redis without leaving the event loop; the rest
    # (embedding, Milvus) blocks, so it runs in a worker thread.
    result = await knowledge.search_cached(name, body.query, **arguments)
    if result is None:
        try:
            result = await blocking(knowledge.search, name, body.query, **arguments, with_text=with_text)
        except TierUnavailableError as exc:
            if body.filter is None or not await searches_without_filter(knowledge, name, body.query, cache, query_cache):
                raise
            raise InvalidInputError(f"filter could not be evaluated by Milvus: {exc}; a filter reads like {FILTER_EXAMPLE}",
                                    field="filter") from exc
        if needs_texts(body) and not with_text:
            [result] = await blocking(fill_texts, knowledge, name, [result], state.settings.service.max_answer_bytes)
    headers = search_headers([result])
    if reranker is not None and body.rerank is not None:
        top_n = body.rerank.top_n or body.top_k
        result = await blocking(rerank_result, result, body.query, reranker, top_n=top_n, scope=rerank_scope(request))
        headers.update(rerank_headers(result))
    max_bytes = state.settings.service.max_answer_bytes
    used = check_answer_bytes(result.hits, max_bytes, include_text=body.include_text, advice=SEARCH_ADVICE)
    if body.prompt_prefix is not None:  # the prompt repeats the hits' texts
        check_answer_bytes(result.hits, max_bytes, advice=SEARCH_ADVICE, used=used)
    answer = result if body.include_text else without_texts(result)
    return JSONResponse(await with_prompt(answer, result, body, request), headers=headers)


def rerank_headers(*results: SearchResult) -> dict[str, str]:
    """``X-Rerank-Fallback`` when any answer is in search order because its reranker failed, else ``X-Rerank``."""
    if any(result.rerank_fallback is not None for result in results):
        return {"X-Rerank-Fallback": "search-order"}
    # A reranker's name may be a path: quoted, so a header never carries a character HTTP cannot.
    return {"X-Rerank": quote(results[0].reranked_by or "", safe="/:._-")}


@router.post("/search/batch", summary="Several queries against one collection in one call")
async def search_batch(body: BatchSearchRequest, request: Request) -> JSONResponse:
    """``{"results": [...]}``, one /search answer per query, in order; the queries are embedded as one batch.
    All the answers together are bounded by ``max_answer_bytes`` (413 beyond)."""
    async with naming_existing_collections(request):
        return await answer_search_batch(body, request)


async def answer_search_batch(body: BatchSearchRequest, request: Request) -> JSONResponse:
    state = state_of(request)
    for index, query in enumerate(body.queries):
        check_text_size(query, f"queries[{index}]", state.settings.service.max_text_bytes)
    name = CollectionName.of(body.collection, principal_of(request).tenant)
    cache, knowledge = cache_of(request, body.model, DOCUMENT, optional=True), knowledge_of(state)
    query_cache = cache_of(request, body.model, QUERY, optional=True)
    arguments = dict(cache=cache, query_cache=query_cache, top_k=body.top_k, filter=body.filter, options=body.options())
    reranker = reranker_of(state, body)
    with_text = reads_texts_with_hits(body, len(body.queries), state)
    results = await blocking(knowledge.search_many, name, body.queries, **arguments, with_text=with_text)
    if needs_texts(body) and not with_text:
        results = await blocking(fill_texts, knowledge, name, results, state.settings.service.max_answer_bytes)
    headers = search_headers(results)
    if reranker is not None and body.rerank is not None:
        top_n, scope = body.rerank.top_n or body.top_k, rerank_scope(request)
        results = [await blocking(rerank_result, result, query, reranker, top_n=top_n, scope=scope)
                   for result, query in zip(results, body.queries)]
        headers.update(rerank_headers(*results))
    hits = (hit for result in results for hit in result.hits)
    check_answer_bytes(hits, state.settings.service.max_answer_bytes, include_text=body.include_text, advice=SEARCH_ADVICE)
    answers = results if body.include_text else [without_texts(result) for result in results]
    return JSONResponse({"results": answers}, headers=headers)


def needs_texts(body: SearchRequest | BatchSearchRequest) -> bool:
    """Whether the answer, the reranker or the prompt needs the hits' texts."""
    return body.include_text or body.rerank is not None or getattr(body, "prompt_prefix", None) is not None


def reads_texts_with_hits(body: SearchRequest | BatchSearchRequest, num_queries: int, state: ServiceState) -> bool:
    """Whether Milvus returns the texts with the hits: when they are needed and cannot pass the answer bound
    (most searches); otherwise they are read afterwards within it (``fill_texts``)."""
    num_hits = num_queries * body.top_k * (body.group_size if body.group_by_source else 1)
    return needs_texts(body) and not may_pass(num_hits, state.settings.service.max_answer_bytes)


def reranker_of(state: ServiceState, body: SearchRequest | BatchSearchRequest) -> RerankCache | None:
    """The reranker a search asked for, checked before any work: an unknown one is the caller's to fix."""
    if body.rerank is None:
        return None
    reranker = state.reranker_for(body.rerank.model, field="rerank.model")
    if body.group_by_source:
        raise InvalidInputError("rerank reorders hits, group_by_source groups them: ask for one of the two", field="rerank")
    return reranker


def search_headers(results: list[SearchResult]) -> dict[str, str]:
    """The mode that answered, and whether any answer fell back to dense search."""
    headers = {"X-Search-Mode": results[0].mode}
    if any(result.fallback is not None for result in results):
        headers["X-Search-Fallback"] = "dense"
    return headers


async def with_prompt(answer: SearchResult | dict[str, Any], result: SearchResult, body: SearchRequest, request: Request) -> Any:
    """The answer, plus ``prompt`` when the request names a registered prefix: its text, the hits of ``result``
    ordered by id, the volatile part last (``ragcache.prefixes.assemble_prompt``), so consecutive prompts share
    the longest possible head in vLLM's prefix cache."""
    if body.prompt_prefix is None:
        return answer
    volatile = f"Question: {body.query}\n" if body.prompt_volatile is None else body.prompt_volatile
    check_text_size(volatile, "prompt_volatile", state_of(request).settings.service.max_text_bytes)
    # The store is Redis (or a file): read it, and count the use, off the event loop.
    name = PrefixName.of(body.prompt_prefix, principal_of(request).tenant, field="prompt_prefix")  # its tenant's
    prefix = await blocking(plain_prefix_used, prefixes_of(request), name)
    fields = dataclasses.asdict(answer) if isinstance(answer, SearchResult) else answer
    return {**fields, "prompt": assemble_prompt(render_text(prefix, {}), result.hits, volatile)}


def plain_prefix_used(registry: PrefixRegistry, name: PrefixName) -> Prefix:
    """The registered prefix ``name``, counted as used; a template is refused (its slots are the caller's)."""
    prefix = registry.get(name)
    if prefix.is_template:
        raise InvalidInputError("prompt_prefix must name a plain prefix, not a template", field="prompt_prefix")
    registry.record_use(name)
    return prefix


async def searches_without_filter(knowledge: KnowledgeBase, collection: CollectionName, query: str, cache, query_cache) -> bool:
    """Whether the search works without its filter. Milvus answers some expressions it parses but cannot
    run (a constant such as ``1 == 1``) with a generic engine error, not its invalid-parameter code: when
    the same search without the filter works, the filter was at fault (422), not the store (503)."""
    try:
        await blocking(knowledge.search, collection, query, cache=cache, query_cache=query_cache, top_k=1, filter=None)
    except TierUnavailableError:
        return False
    return True
