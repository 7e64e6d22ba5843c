"""Request and response bodies at the HTTP edge (pydantic); the library speaks frozen dataclasses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ragcache.documents import COLLECTION_NAME_PATTERN


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EmbedRequest(Body):
    """text-embeddings-inference's /embed body."""

    inputs: StrictStr | list[StrictStr] = Field(description="one text or a list; an empty string is a valid text")
    normalize: StrictBool = Field(True, description="L2-normalise the vectors (TEI's default)")
    truncate: StrictBool | None = Field(None, description="truncate over-long texts; default: the server setting")
    truncation_direction: Literal["Right", "right"] = "Right"
    prompt_name: StrictStr | None = Field(None, description="not supported: prompts are part of the server's space")
    model: StrictStr | None = Field(None, description="served model name; default: the server's model")


class OpenAIEmbeddingsRequest(BaseModel):
    """OpenAI's /v1/embeddings body. Extra fields (e.g. ``user``) are accepted and ignored, as OpenAI does."""

    input: StrictStr | list[StrictStr] = Field(description="one text or a list of texts (token arrays are not supported)")
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, gt=0)
    user: StrictStr | None = None


# The library checks the same rule (ragcache.documents); stating it here puts it in the OpenAPI schema.
COLLECTION = Field(
    pattern=f"^{COLLECTION_NAME_PATTERN.pattern}$",
    description="a letter, then up to 62 letters, digits, '_' or '-'",
)


class DocumentIn(Body):
    id: StrictStr = Field(min_length=1)
    text: StrictStr
    metadata: dict[str, Any] = Field(default_factory=dict)


class AddDocumentsRequest(Body):
    collection: StrictStr = COLLECTION
    documents: list[DocumentIn] = Field(min_length=1)
    model: StrictStr | None = None


class DeleteDocumentsRequest(Body):
    collection: StrictStr = COLLECTION
    ids: list[StrictStr] = Field(min_length=1)


class SearchRequest(Body):
    query: StrictStr
    collection: StrictStr = COLLECTION
    top_k: StrictInt = Field(10, ge=1, le=1000)
    filter: StrictStr | None = Field(None, description='Milvus boolean expression, e.g. metadata["lang"] == "en"')
    model: StrictStr | None = None


class ErrorDetail(BaseModel):
    type: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# Every route can answer these; the OpenAPI schema names the one error body they all share.
ERROR_RESPONSES = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in [
        (400, "the body is not valid JSON"),
        (401, "missing or wrong API key (when the server has one)"),
        (404, "unknown model, collection or prefix"),
        (409, "the collection belongs to another embedding space"),
        (413, "too many texts, or a text over the token limit with truncate=false"),
        (422, "a field is missing, of the wrong type, or invalid; `field` names it"),
        (503, "a store the request needs is down"),
    ]
}
