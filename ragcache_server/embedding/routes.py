"""/embed and TEI's ``POST /`` (text-embeddings-inference), /v1/embeddings (OpenAI), /tokenize and /decode (TEI).

The three embedding routes answer through ``answers.answer``: the plan (``plan.py``), then the vectors and the bytes
(``answers.py``). These FastAPI routes are the OpenAPI schema and the path of what ``EmbedFastPath`` hands over.
"""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Request
from starlette.responses import Response

from ragcache import InvalidInputError
from ragcache_server.deps import blocking, cache_of, check_count, state_of
from ragcache_server.embedding.answers import answer
from ragcache_server.embedding.plan import as_batch, call_of, tokenizer_of
from ragcache_server.errors import HTTPError
from ragcache_server.responses import JSONResponse
from ragcache_server.schemas import (
    OPENAI_ERROR_RESPONSES,
    TEI_ERROR_RESPONSES,
    DecodeRequest,
    EmbedRequest,
    OpenAIEmbeddingsRequest,
    TokenizeRequest,
)

__all__ = ["router"]

router = APIRouter(tags=["embeddings"])


# "/" is text-embeddings-inference's route for the model's own task: for an embedding model, /embed. The most
# used TEI client, huggingface_hub's InferenceClient(model=<url>).feature_extraction(...), posts there.
@router.post("/", summary="Embed texts (text-embeddings-inference's root route, as /embed)", responses=TEI_ERROR_RESPONSES)
@router.post("/embed", summary="Embed texts (text-embeddings-inference compatible)", responses=TEI_ERROR_RESPONSES)
async def embed(body: EmbedRequest, request: Request) -> Response:
    """A JSON list of vectors, one per input; response headers ``X-Cache-*`` tell which level served them."""
    return await answer(call_of(body), request)


@router.post("/v1/embeddings", summary="Embed texts (OpenAI compatible)", responses=OPENAI_ERROR_RESPONSES)
async def openai_embeddings(body: OpenAIEmbeddingsRequest, request: Request) -> Response:
    """OpenAI's response shape; ``encoding_format=base64`` carries raw little-endian float32."""
    return await answer(call_of(body), request)


@router.post("/tokenize", summary="The tokens of texts (text-embeddings-inference compatible)", responses=TEI_ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    """Per input, its tokens: ``{id, text, special, start, stop}`` with character offsets into the input."""
    state = state_of(request)
    texts = as_batch(body.inputs, "inputs", state.settings.service.max_batch, state.settings.service.max_text_bytes)
    if body.prompt_name is not None:
        raise InvalidInputError("prompt_name is not supported: a prompt is part of the server's embedding space", field="prompt_name")
    tokenizer = tokenizer_of(cache_of(request, body.model))
    tokenized = await blocking(tokenizer.tokenize, texts, add_special_tokens=body.add_special_tokens)
    return JSONResponse([[dataclasses.asdict(token) for token in tokens] for tokens in tokenized])


@router.post("/decode", summary="The text of token ids (text-embeddings-inference compatible)", responses=TEI_ERROR_RESPONSES)
async def decode(body: DecodeRequest, request: Request) -> JSONResponse:
    """One text per list of ids (a single list of ids gives a list of one text)."""
    state = state_of(request)
    rows = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
    check_count(rows, "ids", state.settings.service.max_batch)
    tokenizer = tokenizer_of(cache_of(request, body.model))
    try:
        texts = await blocking(tokenizer.decode, rows, skip_special_tokens=body.skip_special_tokens)
    except InvalidInputError as exc:  # an id outside the vocabulary: TEI calls it the tokenizer's error
        raise HTTPError(422, str(exc), field=exc.field, type="tokenizer") from exc
    return JSONResponse(texts)
