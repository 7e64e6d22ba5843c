"""/embed (text-embeddings-inference) and /v1/embeddings (OpenAI): both served through the cache."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from ragcache import InvalidInputError, InvalidTextError
from ragcache.core import EmbeddingCache, EmbedResult, Tokenizer
from ragcache.models import prompt_name_of
from ragcache_server.deps import blocking, cache_of, check_count, check_text_size, served_count_headers, state_of
from ragcache_server.embed_groups import EmbedGroups
from ragcache_server.embed_path import EmbedCall, call_of, check_dimensions, openai_base64_answer
from ragcache_server.errors import HTTPError
from ragcache_server.passthrough import caller_scope
from ragcache_server.responses import JSONResponse
from ragcache_server.schemas import DecodeRequest, EmbedRequest, OpenAIEmbeddingsRequest, TokenizeRequest
from ragcache_server.tokens import token_counts_of

router = APIRouter(tags=["embeddings"])


def as_batch(inputs: str | list[str], field: str, max_batch: int, max_text_bytes: int) -> list[str]:
    """One text or a list, checked against the batch and size limits. Empty strings are valid texts."""
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not texts:
        raise InvalidInputError(f"{field} is an empty list: send at least one text", field=field)
    check_count(texts, field, max_batch)
    # A code point is at most 4 bytes: a batch whose longest text passes by its length needs no look at each one.
    if max(map(len, texts)) * 4 > max_text_bytes:
        for index, text in enumerate(texts):
            check_text_size(text, f"{field}[{index}]" if isinstance(inputs, list) else field, max_text_bytes)
    return texts


def prompted_cache_of(request: Request, model: str | None, prompt_name: str | None, input_type: str | None) -> EmbeddingCache:
    """The cache of an embedding request: an explicit ``prompt_name`` must exist (422 otherwise); the prompt an
    ``input_type`` implies is used when the model has it (clients such as Cohere's always send one)."""
    name = prompt_name_of(prompt_name, input_type)
    return cache_of(request, model, name, optional=prompt_name is None)


def served_headers(result: EmbedResult) -> dict[str, str]:
    """The cache outcome of the request: how many inputs each level served."""
    return served_count_headers(result.served)


async def embed_through_cache(
    cache: EmbeddingCache, texts: list[str], *, normalize: bool, truncate: bool, field: str,
    scope: Callable[[list[str]], AbstractContextManager] | None = None, count_tokens: Callable[[list[str]], int] | None = None,
    groups: EmbedGroups | None = None,
) -> tuple[EmbedResult, int | None]:
    """The texts' vectors, and with ``count_tokens`` their total token count (OpenAI's ``usage``) when the walk
    needs a worker thread anyway: counted in that thread, so that a miss costs one hand-off, not two; None when
    L1 answered on the event loop. ``scope``: what to enter around the walk (a pass-through caller's key);
    ``groups``: walk the texts with other requests' (``ragcache_server.embed_groups``) when nothing is to be entered."""
    # All in L1 (the common case for repeated texts): answer on the event loop, no thread hop. Only when
    # truncating: a cached vector says nothing about whether its text would pass the length check.
    probe = None
    if truncate:
        outcome = cache.probe(texts, normalize=normalize)
        if isinstance(outcome, EmbedResult):
            return outcome, None
        probe = outcome  # the walk continues from it: the texts are hashed and L1 asked once per request

    def work() -> tuple[EmbedResult, int | None]:
        if not truncate:
            try:
                cache.tokenizer.check_lengths(texts, field)
            except InvalidTextError:
                raise  # not valid Unicode: a 422 naming the item, not a length
            except InvalidInputError as exc:
                raise HTTPError(413, str(exc), field=exc.field) from exc
        with scope(texts) if scope is not None else nullcontext():  # pass-through: the caller's own key for their misses
            result = cache.embed_detailed(texts, normalize=normalize, probe=probe)
        return result, count_tokens(texts) if count_tokens is not None else None

    if probe is not None and scope is None and groups is not None:
        return await groups.embed(cache, texts, normalize=normalize, count_tokens=count_tokens)
    # The cache blocks (Redis, Milvus, the model): it runs in a worker thread, off the event loop. At the
    # request deadline the thread is abandoned, not awaited; what it computes still lands in the cache.
    return await blocking(work)


# "/" is text-embeddings-inference's route for the model's own task: for an embedding model, /embed. The most
# used TEI client, huggingface_hub's InferenceClient(model=<url>).feature_extraction(...), posts there. These
# FastAPI routes are the OpenAPI schema and the path of what ``EmbedFastPath`` hands over (embed_path.py); both
# answer through ``answer``.
@router.post("/", summary="Embed texts (text-embeddings-inference's root route, as /embed)")
@router.post("/embed", summary="Embed texts (text-embeddings-inference compatible)")
async def embed(body: EmbedRequest, request: Request) -> Response:
    """A JSON list of vectors, one per input; response headers ``X-Cache-*`` tell which level served them."""
    return await answer(call_of(body), request)


@router.post("/v1/embeddings", summary="Embed texts (OpenAI compatible)")
async def openai_embeddings(body: OpenAIEmbeddingsRequest, request: Request) -> Response:
    """OpenAI's response shape; ``encoding_format=base64`` carries raw little-endian float32."""
    return await answer(call_of(body), request)


async def answer(call: EmbedCall, request: Request) -> Response:
    """The answer to one validated embedding request, on either path."""
    state = state_of(request)
    texts = as_batch(call.inputs, call.field, state.settings.service.max_batch, state.settings.service.max_text_bytes)
    cache = prompted_cache_of(request, call.model, call.prompt_name, call.input_type)
    check_dimensions(call, cache.space.model, cache.space.dim)
    truncate = state.settings.service.truncate if call.truncate is None else call.truncate
    # OpenAI's usage: known on the event loop when every text was counted before, else counted beside the walk.
    token_counts = token_counts_of(request, cache) if call.shape == "openai" else None
    known_tokens = token_counts.known_total(texts) if token_counts is not None else None
    result, num_tokens = await embed_through_cache(
        cache, texts, normalize=call.normalize, truncate=truncate, field=call.field, scope=caller_scope(request, cache),
        count_tokens=token_counts.total if token_counts is not None and known_tokens is None else None,
        groups=request.app.state.embed_groups)
    headers = served_headers(result)
    if call.shape == "tei":
        return JSONResponse(result.vectors, headers=headers)
    assert token_counts is not None
    if known_tokens is not None:
        num_tokens = known_tokens
    elif num_tokens is None:  # L1 answered on the event loop, but a text was never counted
        num_tokens = await blocking(token_counts.total, texts)
    vectors = np.asarray(result.vectors, dtype="<f4")
    model = call.model or cache.space.model
    if call.encoding == "base64":
        return Response(openai_base64_answer(vectors, model, num_tokens), headers=headers, media_type="application/json")
    data = [{"object": "embedding", "embedding": row, "index": index} for index, row in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}, headers=headers)


def tokenizer_of(cache: EmbeddingCache) -> Tokenizer:
    tokenizer = cache.tokenizer
    if not isinstance(tokenizer, Tokenizer):
        raise InvalidInputError(f"model {cache.space.model!r} has no local tokenizer to show", field="model")
    return tokenizer


@router.post("/tokenize", summary="The tokens of texts (text-embeddings-inference compatible)")
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    """Per input, its tokens: ``{id, text, special, start, stop}`` with character offsets into the input."""
    state = state_of(request)
    texts = as_batch(body.inputs, "inputs", state.settings.service.max_batch, state.settings.service.max_text_bytes)
    if body.prompt_name is not None:
        raise InvalidInputError("prompt_name is not supported: a prompt is part of the server's embedding space", field="prompt_name")
    tokenizer = tokenizer_of(cache_of(request, body.model))
    tokenized = await blocking(tokenizer.tokenize, texts, add_special_tokens=body.add_special_tokens)
    return JSONResponse([[dataclasses.asdict(token) for token in tokens] for tokens in tokenized])


@router.post("/decode", summary="The text of token ids (text-embeddings-inference compatible)")
async def decode(body: DecodeRequest, request: Request) -> JSONResponse:
    """One text per list of ids (a single list of ids gives a list of one text)."""
    state = state_of(request)
    rows = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
    check_count(rows, "ids", state.settings.service.max_batch)
    tokenizer = tokenizer_of(cache_of(request, body.model))
    return JSONResponse(await blocking(tokenizer.decode, rows, skip_special_tokens=body.skip_special_tokens))
