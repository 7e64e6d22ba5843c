"""/rerank: text-embeddings-inference's rerank API, with the Cohere/Infinity shape accepted too."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ragcache.rerank import RerankCache, RerankResult
from ragcache_server.deps import blocking, check_count, check_text_size, rerank_scope, served_count_headers, state_of
from ragcache_server.errors import HTTPError
from ragcache_server.responses import JSONResponse
from ragcache_server.schemas import RERANK_ERROR_RESPONSES, RerankRequest

router = APIRouter(tags=["reranking"])


def check_lengths(reranker: RerankCache, query: str, texts: list[str], field: str) -> None:
    """413 naming the first pair over the model's token limit (``truncate: false``). A remote reranker's
    tokenizer is not known here: the remote API judges its own limit."""
    count_tokens = getattr(reranker.reranker, "count_tokens", None)
    if count_tokens is None:
        return
    limit = reranker.reranker.space.max_seq_length
    for index, count in enumerate(count_tokens(query, texts)):
        if count > limit:
            message = (f"{field}[{index}] with the query has {count} tokens, over the reranker's limit of {limit}; "
                       "shorten it or send truncate=true")
            raise HTTPError(413, message, field=f"{field}[{index}]")


@router.post("/rerank", summary="Score texts against a query, best first (text-embeddings-inference and Cohere compatible)",
             responses=RERANK_ERROR_RESPONSES)
async def rerank(body: RerankRequest, request: Request) -> JSONResponse:
    """TEI's answer ``[{index, score}]`` for ``texts``; Cohere's ``{"results": [{index, relevance_score}]}`` for
    ``documents``. Headers ``X-Cache-*`` tell how many scores each level served."""
    state = state_of(request)
    texts, field = body.texts_given()
    check_count(texts, field, state.settings.service.max_batch)
    check_text_size(body.query, "query", state.settings.service.max_text_bytes)
    for index, text in enumerate(texts):
        check_text_size(text, f"{field}[{index}]", state.settings.service.max_text_bytes)
    reranker = state.reranker_for(body.model)
    truncate = state.settings.service.truncate if body.truncate is None else body.truncate

    def work() -> RerankResult:
        if not truncate:
            check_lengths(reranker, body.query, texts, field)
        return reranker.rerank(body.query, texts, top_n=body.top_n, scope=rerank_scope(request))

    result = await blocking(work)
    headers = served_count_headers(result.served)
    if field == "documents":
        results = [
            {"index": hit.index, "relevance_score": hit.score,
             **({"document": {"text": texts[hit.index]}} if body.return_documents else {})}
            for hit in result.hits
        ]
        # "served" (scores per cache level) is ragcache's addition; Cohere and Infinity clients ignore it.
        return JSONResponse({"results": results, "model": result.model, "served": result.served}, headers=headers)
    hits = [{"index": hit.index, "score": hit.score, **({"text": texts[hit.index]} if body.return_text else {})} for hit in result.hits]
    return JSONResponse(hits, headers=headers)
