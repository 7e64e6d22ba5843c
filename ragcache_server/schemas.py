"""Request and response bodies at the HTTP edge (pydantic); the library speaks frozen dataclasses."""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from ragcache import InvalidInputError
from ragcache.retrieval import COLLECTION_NAME_PATTERN, MAX_FILTER_CHARS, MAX_GROUP_SIZE, MAX_OFFSET, MAX_QUERIES, RRF_K, SearchOptions
from ragcache.settings import MAX_BATCH_CEILING

# Metadata nests at most this deep: Milvus stores it as JSON, and every layer of the checks below and in
# Milvus recurses; a caller has no need for more.
MAX_METADATA_DEPTH = 32


InputType = Literal["query", "document", "search_query", "search_document"]  # ragcache.models.prompts.INPUT_TYPES
INPUT_TYPE_HELP = "query, document, search_query or search_document (Voyage, Cohere): that prompt, when the model has one"

# Every list a body may carry is declared with this cap, so that validation stops at the first item past it
# (a 16 MiB body of 762k tiny documents took 5 s and ~600 MB to validate before the 413). The service's own,
# lower ``max_batch`` is checked by the routes (413); this ceiling is what ``max_batch`` may be set to.
TextList = Annotated[list[StrictStr], Field(max_length=MAX_BATCH_CEILING)]
# Token ids one /decode or embedding request may carry, all rows together: 2048 texts of 512 tokens.
MAX_DECODE_IDS = 1 << 20
# A token id: the schema's maximum is the served vocabulary's (``bounded_to_service``, set once the models are loaded).
TokenId = Annotated[StrictInt, Field(ge=0, json_schema_extra={"x-token-id": True}), BeforeValidator(lambda value: _integral(value))]
TokenIds = list[TokenId]
# An embedding request's lists hold at least one text (one text's token ids: at least one id).
InputList = Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_BATCH_CEILING)]
InputIds = Annotated[list[TokenId], Field(min_length=1)]
# An embedding request's input: a text, texts, one text's token ids, or several texts' (OpenAI's and TEI's references
# both take ids; they are decoded with the served model's tokenizer, or sent to a remote model's upstream as they
# are: ragcache_server/embedding/plan.py).
EmbedInputs = StrictStr | InputList | InputIds | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_BATCH_CEILING)]


def count_ids(value: object, field: str) -> object:
    """Token ids counted on the parsed JSON, before any id is validated: a 16 MiB body holds ~8M ids, and rows are
    otherwise only counted as rows (max_batch), so one row could carry all of them."""
    if isinstance(value, list) and value and not isinstance(value[0], str):
        if isinstance(value[0], list) and len(value) > MAX_BATCH_CEILING:
            raise ValueError(f"{field} holds {len(value)} lists, over the limit of {MAX_BATCH_CEILING}: split the request")
        num_ids = sum(len(row) if isinstance(row, list) else 1 for row in value)
        if num_ids > MAX_DECODE_IDS:
            raise ValueError(f"{field} holds {num_ids} token ids, over the limit of {MAX_DECODE_IDS}: split the request")
    return value


# TEI's truncation directions, in any case (huggingface_hub sends "left"; TEI's enum says "Left").
_LEFT, _RIGHT = "[Ll][Ee][Ff][Tt]", "[Rr][Ii][Gg][Hh][Tt]"


def _integral(value: object) -> object:
    """A JSON number with no fraction (``1.0``) as the integer it is: JSON Schema's ``integer`` allows it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EmbedRequest(Body):
    """text-embeddings-inference's /embed body."""

    inputs: EmbedInputs = Field(description="one text or a list (an empty string is a valid text), or token ids: a list "
                                            "of ids or a list of lists, read with the model's tokenizer (a remote "
                                            "model's upstream gets them as they are, where its protocol takes ids)")
    normalize: StrictBool = Field(True, description="L2-normalise the vectors (TEI's default)")
    truncate: StrictBool | None = Field(None, description="truncate over-long texts; default: the server setting")
    truncation_direction: StrictStr = Field(
        "Right", pattern=f"^({_LEFT}|{_RIGHT})$",
        description="Left or Right, in any case (TEI's enum; huggingface_hub sends it lowercase): which end of an "
                    "over-long text is cut when truncating")
    prompt_name: StrictStr | None = Field(None, description="a named prompt of the model (GET /info lists them)",
                                          json_schema_extra={"x-served": "prompt_name"})
    input_type: InputType | None = Field(None, description=INPUT_TYPE_HELP)
    model: StrictStr | None = Field(None, description="served model name; default: the server's model")

    @field_validator("inputs", mode="before")
    @classmethod
    def _count_ids(cls, value: object) -> object:
        return count_ids(value, "inputs")


class TokenizeRequest(Body):
    """text-embeddings-inference's /tokenize body."""

    inputs: StrictStr | InputList = Field(description="one text or a list")
    add_special_tokens: StrictBool = Field(True, description="include the model's special tokens ([CLS], [SEP])")
    prompt_name: None = Field(None, description="not supported: prompts are part of the server's space")
    model: StrictStr | None = Field(None, description="served model name; default: the server's model")


class DecodeRequest(Body):
    """text-embeddings-inference's /decode body."""

    ids: TokenIds | Annotated[list[TokenIds], Field(max_length=MAX_BATCH_CEILING)] = Field(
        description=f"one list of token ids, or a list of them; at most {MAX_DECODE_IDS} ids in all")
    skip_special_tokens: StrictBool = Field(True, description="leave the model's special tokens out of the text")
    model: StrictStr | None = Field(None, description="served model name; default: the server's model")

    @field_validator("ids", mode="before")
    @classmethod
    def _count_ids(cls, value: object) -> object:
        return count_ids(value, "ids")


class OpenAIEmbeddingsRequest(BaseModel):
    """OpenAI's /v1/embeddings body. Extra fields (e.g. ``user``) are accepted and ignored, as OpenAI does."""

    input: EmbedInputs = Field(description="one text or a list of texts, or token ids (a list of ids or a list of lists, "
                                           "read with the model's tokenizer; a remote model's upstream gets them as "
                                           "they are, where its protocol takes ids)")
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, gt=0, description="only the model's own is served",
                                         json_schema_extra={"x-served": "dimensions"})
    user: StrictStr | None = None
    prompt_name: StrictStr | None = Field(None, description="a named prompt of the model (GET /info lists them)",
                                          json_schema_extra={"x-served": "prompt_name"})
    input_type: InputType | None = Field(None, description=INPUT_TYPE_HELP)

    @field_validator("input", mode="before")
    @classmethod
    def _count_ids(cls, value: object) -> object:
        return count_ids(value, "input")


# The library checks the same rule (ragcache.retrieval.documents); stating it here puts it in the OpenAPI schema.
COLLECTION = Field(
    pattern=f"^{COLLECTION_NAME_PATTERN.pattern}$",
    description="a letter, then up to 62 letters, digits, '_' or '-'",
)
# The same rule for a collection named in a path (DELETE /collections/{collection}).
CollectionPath = Annotated[str, Path(pattern=f"^{COLLECTION_NAME_PATTERN.pattern}$",
                                     description="a letter, then up to 62 letters, digits, '_' or '-'")]


class DocumentIn(Body):
    id: StrictStr = Field(min_length=1)
    text: StrictStr = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict, description=f"JSON, nested at most {MAX_METADATA_DEPTH} deep")

    @field_validator("metadata")
    @classmethod
    def _check_depth(cls, value: dict[str, Any]) -> dict[str, Any]:
        if _depth(value) > MAX_METADATA_DEPTH:
            raise ValueError(f"metadata nests deeper than {MAX_METADATA_DEPTH} levels")
        return value


def _depth(value: object) -> int:
    """How deep objects and lists nest in ``value``, walked without recursion (a hostile depth cannot
    exhaust the stack here)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_METADATA_DEPTH:
                pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


class SyncIn(Body):
    """Delete what is gone from the source after this ingest (ragcache.retrieval.sync); needs the ``admin`` scope."""

    # A scope limits a full cleanup only (ragcache.retrieval.sync refuses it with an incremental one): in the schema too.
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "if": {"properties": {"scope": {"type": "string"}}, "required": ["scope"]},
        "then": {"properties": {"cleanup": {"const": "full"}}, "required": ["cleanup"]},
    })

    cleanup: Literal["incremental", "full"] = Field(
        "incremental",
        description="incremental: documents of this request's sources (metadata.source) that it did not send; "
        "full: every document (of `scope`) that it did not send",
    )
    scope: StrictStr | None = Field(None, max_length=MAX_FILTER_CHARS, description="full only: a filter limiting what may be deleted")


class AddDocumentsRequest(Body):
    collection: StrictStr = COLLECTION
    documents: list[DocumentIn] = Field(min_length=1, max_length=MAX_BATCH_CEILING)
    model: StrictStr | None = None
    sync: SyncIn | None = Field(None, description="unchanged documents are always skipped; this also deletes what is gone")


class ListIdsRequest(Body):
    collection: StrictStr = COLLECTION
    filter: StrictStr | None = Field(None, max_length=MAX_FILTER_CHARS, description="Milvus boolean expression")


class DeleteDocumentsRequest(Body):
    collection: StrictStr = COLLECTION
    ids: list[Annotated[StrictStr, Field(min_length=1)]] = Field(min_length=1, max_length=MAX_BATCH_CEILING)


class GetDocumentsRequest(Body):
    collection: StrictStr = COLLECTION
    ids: list[Annotated[StrictStr, Field(min_length=1)]] = Field(min_length=1, max_length=MAX_BATCH_CEILING)


class SearchOptionsBody(Body):
    """How /search ranks (ragcache.retrieval.ranking.SearchOptions, which checks the same rules)."""

    top_k: StrictInt = Field(10, ge=1, le=1000)
    filter: StrictStr | None = Field(
        None, max_length=MAX_FILTER_CHARS, description='Milvus boolean expression, e.g. metadata["lang"] == "en"'
    )
    model: StrictStr | None = None
    mode: Literal["dense", "keyword", "hybrid"] = Field("dense", description="vectors, BM25, or both fused")
    fusion: Literal["rrf", "weighted"] = Field("rrf", description="hybrid: reciprocal-rank or weighted-score fusion")
    rrf_k: StrictInt = Field(RRF_K, ge=1, le=10_000, description="the k of reciprocal-rank fusion")
    dense_weight: StrictFloat = Field(0.5, ge=0, le=1, description="weighted fusion: the dense share (keyword: 1 - it)")
    offset: StrictInt = Field(0, ge=0, le=MAX_OFFSET, description="hits (or groups) to skip: paging")
    score_threshold: StrictFloat | None = Field(None, allow_inf_nan=False, description="drop hits scoring under it (the mode's score)")
    mmr_lambda: StrictFloat | None = Field(None, ge=0, le=1, description="MMR diversity: 1 relevance only, 0 diversity only")
    group_by_source: StrictBool = Field(False, description="group hits by metadata.source; top_k counts groups")
    group_size: StrictInt = Field(1, ge=1, le=MAX_GROUP_SIZE, description="hits kept per source when grouping")

    def options(self) -> SearchOptions:
        return SearchOptions(**self.model_dump(include=set(SearchOptions.__dataclass_fields__)))


class RerankStage(Body):
    """Rerank the search's ``top_k`` hits with a cross-encoder and keep the best ``top_n`` (docs/reranking.md)."""

    top_n: StrictInt | None = Field(None, ge=1, le=1000, description="hits kept after reranking; default: top_k")
    model: StrictStr | None = Field(None, description="served reranker name; default: the first served")


class SearchRequest(SearchOptionsBody):
    query: StrictStr = Field(min_length=1)
    collection: StrictStr = COLLECTION
    rerank: RerankStage | None = Field(None, description="reorder the hits by a reranker's scores",
                                       json_schema_extra={"x-served": "reranker"})
    prompt_prefix: StrictStr | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="a registered (plain) prefix: the answer adds `prompt` = the prefix, the hits by id, `prompt_volatile` last")
    prompt_volatile: StrictStr | None = Field(None, description="what goes last in `prompt` (default: 'Question: <query>')")
    include_text: StrictBool = Field(True, description="false: hits without their text (id, score, metadata), a far smaller answer")


class BatchSearchRequest(SearchOptionsBody):
    queries: list[Annotated[StrictStr, Field(min_length=1)]] = Field(min_length=1, max_length=MAX_QUERIES)
    collection: StrictStr = COLLECTION
    rerank: RerankStage | None = Field(None, description="reorder each query's hits by a reranker's scores",
                                       json_schema_extra={"x-served": "reranker"})
    include_text: StrictBool = Field(True, description="false: hits without their text (id, score, metadata), a far smaller answer")


class CohereDocument(Body):
    text: StrictStr


class RerankRequest(Body):
    """text-embeddings-inference's /rerank body (``texts``); the Cohere/Infinity body (``documents``,
    ``top_n``, ``model``, ``return_documents``) is accepted too, and answered in its own shape."""

    query: StrictStr
    # Exactly one of texts and documents, neither null: what ``texts_given`` checks, stated in the schema.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [{"required": ["texts"]}, {"required": ["documents"]}]})

    texts: TextList = Field(None, description="TEI: the texts to score against the query")  # type: ignore[arg-type]
    documents: Annotated[list[StrictStr | CohereDocument], Field(max_length=MAX_BATCH_CEILING)] = Field(
        None, description="Cohere/Infinity: the texts (or {text})")  # type: ignore[arg-type]
    return_text: StrictBool = Field(False, description="TEI: echo each text in its result")
    return_documents: StrictBool = Field(False, description="Cohere/Infinity: echo each document in its result")
    truncate: StrictBool | None = Field(None, description="truncate over-long pairs; default: the server setting")
    truncation_direction: StrictStr = Field("Right", pattern=f"^{_RIGHT}$",
                                            description="Right, in any case: pairs are cut at their end")
    raw_scores: Literal[False] = Field(False, description="scores are the model's sigmoid; raw logits are not served")
    top_n: StrictInt | None = Field(None, ge=1, description="return the best n only; default: all, sorted")
    model: StrictStr | None = Field(None, description="served reranker name; default: the first served")

    def texts_given(self) -> tuple[list[str], str]:
        """(the texts, the field they came in): exactly one of ``texts`` and ``documents``."""
        if (self.texts is None) == (self.documents is None):
            field = "texts" if self.texts is None else "documents"
            raise InvalidInputError("send the texts to score as either texts (TEI) or documents (Cohere), not both or neither", field=field)
        if self.texts is not None:
            return self.texts, "texts"
        return [doc if isinstance(doc, str) else doc.text for doc in self.documents or []], "documents"


class ErrorDetail(BaseModel):
    type: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    """ragcache's own error body (every route but OpenAI's and TEI's, ragcache_server/error_shapes.py)."""

    error: ErrorDetail


class TEIErrorResponse(BaseModel):
    """text-embeddings-inference's error body (its routes: /embed, /, /tokenize, /decode, /rerank with ``texts``),
    with ragcache's ``type`` and ``field`` beside it."""

    error: str
    error_type: Literal["Validation", "Tokenizer", "Overloaded", "Backend", "Unhealthy"]
    type: str | None = None
    field: str | None = None


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    field: str | None = None


class OpenAIErrorResponse(BaseModel):
    """OpenAI's error body (``/v1/*``), with ragcache's ``field`` beside ``param``."""

    error: OpenAIErrorDetail


ERROR_STATUSES = [
    (400, "the body is not valid JSON"),
    (401, "missing or wrong API key (when the server has keys)"),
    (403, "the API key lacks the scope this route needs, or an ingest would pass the tenant's collection quota"),
    (404, "unknown model, collection or prefix"),
    (408, "the body did not arrive within the server's body timeout"),
    (409, "the collection belongs to another embedding space"),
    (413, "too many texts, a text or body over the size limit, a text over the token limit with truncate=false, "
          "or an answer over the answer limit"),
    (422, "a field is missing, of the wrong type, or invalid; `field` names it"),
    (429, "this key's rate limit is exhausted; Retry-After says when to retry"),
    (503, "a store the request needs is down, or the model's queue is full (Retry-After says when to retry)"),
    (504, "the request took longer than the server's request timeout"),
]
# Every route can answer these; the OpenAPI schema names the error body of each route family.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description} for status, description in ERROR_STATUSES
}
TEI_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": TEIErrorResponse, "description": description} for status, description in ERROR_STATUSES
}
# OpenAI answers an invalid request 400, whatever made it invalid (ragcache's 413s and 422s).
OPENAI_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": OpenAIErrorResponse, "description": description}
    for status, description in [(400, "an invalid request: not JSON, a field missing, wrong or over a limit; `param` "
                                      "names it"), *((status, text) for status, text in ERROR_STATUSES
                                                     if status not in (400, 413, 422))]
}
# Every 4xx in OpenAI's shape: FastAPI's own 422 entry (a shape never answered here) is left out for it.
OPENAI_ERROR_RESPONSES["4XX"] = {"model": OpenAIErrorResponse, "description": "any other refusal, in OpenAI's shape"}
# /rerank answers TEI's body for TEI's request (``texts``) and ragcache's for the Cohere/Infinity one (``documents``).
RERANK_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": TEIErrorResponse | ErrorResponse, "description": description}
    for status, description in ERROR_STATUSES
}


def bounded_to_service(schema: dict[str, Any], *, max_batch: int, max_token_id: int | None = None,
                       prompt_names: Collection[str] = (), dimensions: Collection[int] = (), rerankers: bool = True) -> dict[str, Any]:
    """The OpenAPI ``schema`` with what this service serves, so that a request it allows is one the service serves:
    every list declared at the ceiling (``TextList``, ids, documents) at ``max_batch`` (the routes' 413 past it), token
    ids up to the served vocabulary's last (None: no local tokenizer), the named prompts and dimensions the models
    have, and no rerank route or stage when no reranker is served."""
    served: dict[str, list[Any]] = {"prompt_name": [*sorted(prompt_names), None], "dimensions": [*sorted(dimensions), None]}
    if not rerankers:
        schema.get("paths", {}).pop("/rerank", None)
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if node.get("maxItems") == MAX_BATCH_CEILING:
                node["maxItems"] = max_batch
            if node.pop("x-token-id", False) and max_token_id is not None:
                node["maximum"] = max_token_id
            kind = node.pop("x-served", None)
            if kind in served:
                node["enum"] = served[kind]
            properties = node.get("properties")
            if not rerankers and isinstance(properties, dict):
                for name in [name for name, value in properties.items() if isinstance(value, dict) and value.get("x-served") == "reranker"]:
                    del properties[name]
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return schema
