"""One embedding request's decisions, made once (``plan_of``): what was asked (``EmbedCall``, from either route's
validated body), the texts (token ids decoded with the served model's tokenizer), the cache view (model, named prompt,
tenant), truncation, where OpenAI's token counts come from (the memo, or counted beside the walk) and the caller's own
provider key (pass-through). The vectors and the bytes (``answers.py``) only read the plan.

Pass-through of the caller's own provider key to a remote model (``pass_through_auth``, off by default) is decided
here, and only for a model whose capabilities say ``passes_caller_key``: no other request reads the headers. The
caller's key comes from ``X-Upstream-Authorization: Bearer <key>``, or, when this service has no API keys of its own,
from ``Authorization`` (so an OpenAI SDK pointed at ragcache sends its key as usual). With API keys configured,
``Authorization`` carries the ragcache key, which never leaves this service.

The trade-off (docs/providers.md): the cache is shared. A miss is computed with the key of the caller who missed it,
and the vector then serves every caller as a hit, paid for by whoever missed it first. A key the upstream refuses or
rate-limits fails only that caller's misses (a 4xx for it, 429 included, is not retried and does not open the
model's breaker), and a caller needs no valid provider key at all to be served hits: pass-through decides who pays,
not who may use the service (that is what ragcache's own API keys are for).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from starlette.requests import Request

from ragcache import InvalidInputError
from ragcache.core import TOKEN_IDS, EmbeddingCache, Scope, Tokenizer, token_ids_text
from ragcache.models import ApiKey, prompt_name_of
from ragcache_server.deps import blocking, cache_of, check_count, check_text_size, state_of
from ragcache_server.embedding.tokens import TokenCounts, token_counts_of
from ragcache_server.errors import HTTPError
from ragcache_server.schemas import EmbedInputs, EmbedRequest, OpenAIEmbeddingsRequest

__all__ = ["FAST_PATHS", "REQUEST_MODELS", "UPSTREAM_HEADER", "EmbedCall", "EmbedPlan", "as_batch", "call_of",
           "caller_key_of", "plan_of", "tokenizer_of"]

Shape = Literal["tei", "openai"]
# The routes' paths and the shape of their bodies and answers.
FAST_PATHS: dict[str, Shape] = {"/embed": "tei", "/": "tei", "/v1/embeddings": "openai"}
REQUEST_MODELS: dict[Shape, type[BaseModel]] = {"tei": EmbedRequest, "openai": OpenAIEmbeddingsRequest}
# What a caller whose token ids are another tokenizer's is told to do.
TOKEN_ID_ADVICE = ("token ids are read with the served model's own tokenizer; ids of another tokenizer (tiktoken's, which "
                   "langchain-openai's OpenAIEmbeddings sends unless check_embedding_ctx_length=False) are not its "
                   "vocabulary: send the text instead")


@dataclass(frozen=True)
class EmbedCall:
    """One embedding request, validated: what both paths answer from."""

    shape: Shape
    inputs: EmbedInputs  # as sent: a text, texts, token ids or lists of them (a list names its items inputs[i])
    field: str  # the body's name for them: "inputs" (TEI) or "input" (OpenAI)
    model: str | None
    prompt_name: str | None
    input_type: str | None
    normalize: bool  # TEI's flag; OpenAI's vectors are the model's own
    truncate: bool | None  # None: the server's setting
    encoding: Literal["json", "float", "base64"]  # json: TEI's list of lists; float/base64: OpenAI's encoding_format
    dimensions: int | None
    truncate_left: bool = False  # TEI's truncation_direction Left: an over-long text loses its beginning, not its end


def call_of(body: BaseModel) -> EmbedCall:
    """The ``EmbedCall`` of a validated body of either route."""
    if isinstance(body, EmbedRequest):
        return EmbedCall("tei", body.inputs, "inputs", body.model, body.prompt_name, body.input_type, body.normalize,
                         body.truncate, "json", None, truncate_left=body.truncation_direction.lower() == "left")
    assert isinstance(body, OpenAIEmbeddingsRequest)
    return EmbedCall("openai", body.input, "input", body.model, body.prompt_name, body.input_type, False, None,
                     body.encoding_format, body.dimensions)


@dataclass(frozen=True)
class EmbedPlan:
    """What one embedding request will do, decided once (the module docstring)."""

    call: EmbedCall
    texts: list[str]
    cache: EmbeddingCache  # the view the texts are embedded through: model, named prompt, tenant
    truncate: bool
    model: str  # the name the answer gives
    token_counts: TokenCounts | None  # OpenAI's usage: the memo of the space's counts (None: TEI, no usage)
    known_tokens: int | None  # the total, when the memo knew every text (no counting at all)
    caller_scope: Callable[[list[str]], AbstractContextManager] | None  # pass-through: the caller's key for misses

    @property
    def count_in_walk(self) -> Callable[[list[str]], int] | None:
        """What counts the texts' tokens in the walk's thread (a miss then costs one hand-off, not two)."""
        return self.token_counts.total if self.token_counts is not None and self.known_tokens is None else None


async def plan_of(call: EmbedCall, request: Request) -> EmbedPlan:
    """``call``'s plan; the refusals (sizes, model, prompt, dimensions, token ids) are raised here, before any walk."""
    service = state_of(request).settings.service
    token_ids = _is_token_ids(call.inputs)
    if not token_ids:  # the batch's own limits first, as every route checks them
        texts = as_batch(call.inputs, call.field, service.max_batch, service.max_text_bytes)  # type: ignore[arg-type]
    cache = cache_of(request, call.model, prompt_name_of(call.prompt_name, call.input_type), optional=call.prompt_name is None)
    truncate = service.truncate if call.truncate is None else call.truncate
    known_tokens: int | None = None
    if token_ids and cache.capabilities.takes_token_ids:  # a remote model whose upstream reads ids: sent as they are
        cache, texts, known_tokens = _upstream_ids(call, cache, truncate, service.max_batch)
        truncate = True  # their lengths are checked (or cut) above: the walk has no tokenizer to check them with
    else:
        if token_ids:
            texts = await _decoded(call, cache, service.max_batch)
        if call.truncate_left and truncate:
            texts = await _cut_on_the_left(texts, cache)
    if call.dimensions is not None and call.dimensions != cache.space.dim:  # OpenAI's: only the model's own is served
        raise InvalidInputError(f"dimensions={call.dimensions} is not available: {cache.space.model} gives "
                                f"{cache.space.dim} dimensions only", field="dimensions")
    token_counts = token_counts_of(request, cache) if call.shape == "openai" else None
    return EmbedPlan(call, texts, cache, truncate=truncate,
                     model=call.model or cache.space.model, token_counts=token_counts,
                     known_tokens=(known_tokens if known_tokens is not None else token_counts.known_total(texts))
                     if token_counts is not None else None,
                     caller_scope=_caller_scope(request, cache) if cache.capabilities.passes_caller_key else None)


UPSTREAM_HEADER = "X-Upstream-Authorization"
MAX_HEADER_CHARS = 4096


def caller_key_of(request: Request) -> ApiKey | None:
    """The caller's provider key, or None when it sent none; 400 naming the header when malformed."""
    settings = request.app.state.settings
    header, value = UPSTREAM_HEADER, request.headers.get(UPSTREAM_HEADER)
    has_own_keys = bool(settings.access.api_key or settings.access.api_keys or settings.access.api_keys_file)
    if value is None and not has_own_keys:
        header, value = "Authorization", request.headers.get("Authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    # Printable ASCII only: the server hands header bytes over as latin-1, and a key of other characters could
    # not be sent upstream (it was a 500 with a traceback when the outbound request encoded it).
    printable = value.isascii() and value.isprintable()
    if not printable or scheme.lower() != "bearer" or not token.strip() or len(value) > MAX_HEADER_CHARS:
        raise HTTPError(400, f"{header} must be 'Bearer <provider key>' in printable ASCII (at most {MAX_HEADER_CHARS} "
                             "characters)", field=header)
    return ApiKey(token.strip())


def _caller_scope(request: Request, cache: EmbeddingCache) -> Callable[[list[str]], AbstractContextManager] | None:
    """What to enter around the cache call for ``texts`` of a model that passes keys through: the caller's key for
    their misses (``caller_key``, declared by ``Capabilities.passes_caller_key``; a no-op for a caller with no key
    or a model whose ``pass_through_auth`` is off)."""
    encoder: Any = cache.encoder  # the capability declares caller_key, which the Encoder protocol leaves out
    api_key = caller_key_of(request)
    return lambda texts: encoder.caller_key(cache.model_inputs(texts), api_key)


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


def tokenizer_of(cache: EmbeddingCache, field: str = "model") -> Tokenizer:
    """The model's local tokenizer; a model served remotely has none here."""
    tokenizer = cache.tokenizer
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if field in ("input", "inputs"):  # token ids for a remote model that is not sent them (``_upstream_ids``)
        raise InvalidInputError(f"model {cache.space.model!r} is served by a remote API that is not sent token ids (its "
                                "protocol takes none, or a configured prompt goes before every input) and has no local "
                                "tokenizer here to read them with: send text instead of token ids", field=field)
    raise InvalidInputError(f"model {cache.space.model!r} has no local tokenizer here (it is served by a remote "
                            f"API){': send text instead of token ids' if field != 'model' else ''}", field=field)


def _is_token_ids(inputs: EmbedInputs) -> bool:
    return isinstance(inputs, list) and bool(inputs) and not isinstance(inputs[0], str)


def _id_rows(call: EmbedCall, max_batch: int) -> tuple[list[list[int]], bool]:
    """Token-id input as rows of ids (one text's ids: one row), counted like /decode's; and whether it was one row."""
    one_text = isinstance(call.inputs[0], int)
    rows: list[list[int]] = [call.inputs] if one_text else call.inputs  # type: ignore[assignment, list-item]
    check_count(rows, call.field, max_batch)
    return rows, one_text


def _upstream_ids(call: EmbedCall, cache: EmbeddingCache, truncate: bool,
                  max_batch: int) -> tuple[EmbeddingCache, list[str], int]:
    """Token ids for a model that takes them (``Capabilities.takes_token_ids``): the view they walk the cache
    through (``TOKEN_IDS``: keys of their own, sent upstream as ids on a miss), their texts there, their count.
    Bounded as /decode's (schemas.py counts them); the upstream judges the ids against its vocabulary, which this
    service does not know. Not truncating, an id list over the model's length is a 413, as a text's; truncating on
    the left keeps its last ids (on the right the upstream truncates, as it does a text)."""
    if cache.scope.prompt is not None:
        field = "prompt_name" if call.prompt_name is not None else "input_type"
        raise InvalidInputError(f"a named prompt is text and cannot be put before token ids for model "
                                f"{cache.space.model!r} (served by a remote API): send text to embed under a prompt",
                                field=field)
    rows, one_text = _id_rows(call, max_batch)
    limit = cache.space.max_seq_length
    if truncate and call.truncate_left:
        rows = [row[-limit:] for row in rows]
    elif not truncate:
        for index, row in enumerate(rows):
            if len(row) > limit:
                field = call.field if one_text else f"{call.field}[{index}]"
                raise HTTPError(413, f"{field} has {len(row)} token ids, over the limit of model {cache.space.model!r} "
                                     f"of {limit}; shorten it or send truncate=true", field=field)
    view = cache.scoped(Scope(cache.scope.tenant, TOKEN_IDS))
    return view, [token_ids_text(row) for row in rows], sum(map(len, rows))


_ID_FIELD = re.compile(r"^ids\[(\d+)\]\[(\d+)\]$")


async def _decoded(call: EmbedCall, cache: EmbeddingCache, max_batch: int) -> list[str]:
    """The texts of token-id input (one list of ids, or a list of them), decoded with the served model's tokenizer;
    an id outside its vocabulary is refused naming the item (schemas.py bounds the ids, as /decode's)."""
    rows, one_text = _id_rows(call, max_batch)
    tokenizer = tokenizer_of(cache, call.field)
    try:
        return await blocking(tokenizer.decode, rows, skip_special_tokens=True)
    except InvalidInputError as exc:
        found = _ID_FIELD.match(exc.field or "")
        if found is None:
            raise
        row, column = found.groups()
        field = f"{call.field}[{column}]" if one_text else f"{call.field}[{row}][{column}]"
        raise HTTPError(422, f"{field}: {exc}; {TOKEN_ID_ADVICE}", field=field, type="tokenizer") from exc


async def _cut_on_the_left(texts: list[str], cache: EmbeddingCache) -> list[str]:
    """``texts`` with each over-long one cut at its beginning to what the model keeps of it: the model then truncates
    nothing, and the cut text is its own key (a text short enough is unchanged, so are its key and vector)."""
    tokenizer = tokenizer_of(cache, "truncation_direction")
    limit = cache.space.max_seq_length

    def cut() -> list[str]:
        counts = tokenizer.count_tokens(texts)  # special tokens included, as the model counts
        long = [index for index, count in enumerate(counts) if count > limit]
        if not long:
            return texts
        cut_texts = list(texts)
        for index, tokens in zip(long, tokenizer.tokenize([texts[index] for index in long], add_special_tokens=False)):
            kept = tokens[len(tokens) - (limit - (counts[index] - len(tokens))):]  # the special tokens need room too
            text = texts[index]
            # From the first kept token that begins a word: a cut inside a word would tokenize differently.
            first = next((token.start for token in kept if token.start is not None
                          and (token.start == 0 or not text[token.start - 1].isalnum())), None)
            cut_texts[index] = text[first:] if first is not None else ""
        return cut_texts

    return await blocking(cut)
