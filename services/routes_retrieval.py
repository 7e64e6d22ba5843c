"""/documents, /collections and /search over the knowledge base."""

from __future__ import annotations

from functools import partial

from anyio import to_thread
from fastapi import APIRouter, Request

from ragcache.knowledge import KnowledgeBase
from services.errors import HTTPError
from services.responses import JSONResponse
from services.schemas import AddDocumentsRequest, DeleteDocumentsRequest, SearchRequest
from services.state import ServiceState

router = APIRouter(tags=["retrieval"])


def knowledge_of(state: ServiceState) -> KnowledgeBase:
    if state.knowledge is None:
        raise HTTPError(503, "retrieval needs Milvus, which is off: set RAGCACHE_MILVUS_URI", type="unavailable")
    return state.knowledge


@router.post("/documents", summary="Add or replace documents (upsert by id)")
async def add_documents(body: AddDocumentsRequest, request: Request) -> JSONResponse:
    state: ServiceState = request.app.state.ragcache
    if len(body.documents) > state.settings.max_batch:
        raise HTTPError(413, f"documents has {len(body.documents)} items, over the limit of {state.settings.max_batch}: split it", field="documents")
    cache = state.cache_for(body.model)
    documents = [document.model_dump() for document in body.documents]
    add = partial(knowledge_of(state).add_documents, body.collection, documents, cache=cache)
    return JSONResponse(await to_thread.run_sync(add))


@router.delete("/documents", summary="Delete documents by id")
async def delete_documents(body: DeleteDocumentsRequest, request: Request) -> JSONResponse:
    knowledge = knowledge_of(request.app.state.ragcache)
    num_deleted = await to_thread.run_sync(knowledge.delete_documents, body.collection, body.ids)
    return JSONResponse({"collection": body.collection, "num_deleted": num_deleted})


@router.get("/collections", summary="Collections with their embedding space and size")
async def list_collections(request: Request) -> JSONResponse:
    knowledge = knowledge_of(request.app.state.ragcache)
    return JSONResponse({"collections": await to_thread.run_sync(knowledge.list_collections)})


@router.post("/search", summary="The documents nearest to a query")
async def search(body: SearchRequest, request: Request) -> JSONResponse:
    state: ServiceState = request.app.state.ragcache
    cache, knowledge = state.cache_for(body.model), knowledge_of(state)
    arguments = dict(cache=cache, top_k=body.top_k, filter=body.filter)
    # A repeated query's result list comes from Redis without leaving the event loop; the rest (embedding,
    # Milvus) blocks, so it runs in a worker thread.
    cached = await knowledge.search_cached(body.collection, body.query, **arguments)
    if cached is not None:
        return JSONResponse(cached)
    return JSONResponse(await to_thread.run_sync(partial(knowledge.search, body.collection, body.query, **arguments)))
