"""What goes over the wire: a call (method, path, body, how to read the answer), the errors an answer maps
to, and the parser of each answer."""

from __future__ import annotations

import binascii
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import pybase64

from ragcache.errors import (
    AuthenticationError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    RagCacheError,
    ServiceError,
    ServiceUnavailableError,
)
from ragcache.prefixes.model import Prefix, check_name
from ragcache.prefixes.results import RegisterResult, WarmOutcome, WarmResult
from ragcache.prefixes.text import Chunk, assemble_prompt
from ragcache.rerank.base import RerankHit, RerankResult
from ragcache.retrieval.documents import Document
from ragcache.retrieval.ranking import SearchOptions
from ragcache.retrieval.results import CollectionInfo, SearchGroup, SearchHit, SearchResult, SearchTimings

# The search answer of the service is the library's SearchResult, field for field.
SearchResponse = SearchResult


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: Any
    parse: Callable[[Any], Any]  # the decoded JSON answer -> the value the operation returns



def _prefix_path(name: str, suffix: str = "") -> str:
    # The name is checked and escaped: it goes into the path, where "x/../../stats" would reach another
    # route with the caller's key.
    return f"/prefixes/{quote(check_name(name), safe='')}{suffix}"


def _with_chunks(messages: list[dict[str, str]], chunks: Iterable[Chunk]) -> list[dict[str, str]]:
    system, *rest = messages
    return [{**system, "content": assemble_prompt(system["content"], chunks)}, *rest]


# ---- reading answers ----------------------------------------------------------------------------------------


def _finish(call: _Call, response: httpx.Response, *, sent_key: bool = True) -> Any:
    """The operation's value from a final answer, or the error it stands for (``sent_key``: whether the
    request carried an API key, which a 401's advice depends on)."""
    if not response.is_success:
        raise _status_error(response, sent_key=sent_key)
    try:
        return call.parse(response.json() if response.content else None)
    except (ValueError, TypeError, KeyError, IndexError, binascii.Error) as exc:
        raise ServiceError(f"{call.method} {call.path}: unexpected answer from the service: {exc!r}") from exc


def _status_error(response: httpx.Response, *, sent_key: bool = True) -> RagCacheError:
    message, field = _error_details(response)
    status = response.status_code
    error: RagCacheError
    if status in (400, 413, 422):
        error = InvalidInputError(message, field=field)
    elif status == 404:
        # field says what is missing: "collection" (a collection not yet written) or "model" (not served here).
        error = NotFoundError(message, field=field)
    elif status == 409:
        error = ConflictError(message)
    elif status == 401:
        error = AuthenticationError(_key_advice(sent_key))
    elif status == 403:
        error = AuthenticationError(message)
    elif status in (429, 502, 503, 504):
        error = ServiceUnavailableError(message)
    else:
        error = ServiceError(message)
    error.status_code = status  # type: ignore[union-attr]
    return error


def _key_advice(sent_key: bool) -> str:
    """A 401 in the client's own terms: the server's advice names an HTTP header, which a client user never sets."""
    if sent_key:
        return ("the service refused this client's API key (401): check the key given as Client(api_key=...) "
                "(the CLI: --api-key or RAGCACHE_API_KEY)")
    return ("the service needs an API key (401) and this client sent none: pass Client(api_key=...) "
            "(the CLI: --api-key or RAGCACHE_API_KEY)")


def _error_details(response: httpx.Response) -> tuple[str, str | None]:
    """(message, field) from ``{"error": {...}}``, FastAPI's ``{"detail": ...}``, or the raw text."""
    fallback = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    try:
        payload = response.json()
    except ValueError:
        return (response.text.strip()[:1000] or fallback), None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        # The service's shape, and OpenAI's on /v1/* (``param`` where the service's has ``field``).
        return str(error["message"]), error.get("field") or error.get("param")
    if isinstance(error, str) and error:
        return error, None  # TEI's shape on TEI's routes: {"error": "<message>", "error_type": ...}
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if isinstance(detail, str):
        return detail, None
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        # FastAPI validation errors: a list of {"loc": ["body", "top_k"], "msg": ...}.
        location = [str(part) for part in detail[0].get("loc", []) if part != "body"]
        messages = "; ".join(str(item.get("msg", item)) for item in detail)
        return messages, ".".join(location) or None
    return fallback, None


def _parse_embeddings(num_texts: int, payload: dict) -> np.ndarray:
    data = sorted(payload["data"], key=lambda item: item["index"])
    if len(data) != num_texts:
        raise ValueError(f"{len(data)} embeddings for {num_texts} texts")
    if not data:
        return np.empty((0, 0), dtype=np.float32)
    return np.stack([_decode_vector(item["embedding"]) for item in data])


def _decode_vector(embedding: str | list) -> np.ndarray:
    if isinstance(embedding, str):
        # OpenAI's base64 format: the raw little-endian float32 bytes.
        return np.frombuffer(pybase64.b64decode(embedding, validate=True), dtype="<f4").astype(np.float32)
    return np.asarray(embedding, dtype=np.float32)


def _with_hit_options(body: dict[str, Any], rerank: Mapping[str, Any] | None, include_text: bool) -> dict[str, Any]:
    """``body`` plus the rerank stage and ``include_text``, each only when asked for (a server that predates
    one still takes the rest)."""
    if rerank is not None:
        body["rerank"] = dict(rerank)
    if not include_text:
        body["include_text"] = False
    return body


def _options_body(options: SearchOptions | None) -> dict[str, Any]:
    """The options that differ from the defaults (a server that predates an option still takes the rest)."""
    if options is None:
        return {}
    default = SearchOptions()
    return {name: value for name, value in dataclasses.asdict(options).items() if getattr(default, name) != value}


def _parse_search(payload: dict) -> SearchResult:
    hits = tuple(
        SearchHit(str(hit["id"]), float(hit["score"]), str(hit.get("text", "")), dict(hit.get("metadata") or {}))
        for hit in payload["hits"]
    )
    timings = payload.get("timings_ms") or {}
    groups = payload.get("groups")
    return SearchResult(
        hits=hits,
        embedding_level=payload.get("embedding_level"),
        timings_ms=SearchTimings(*(float(timings.get(name, 0.0)) for name in ("embed", "search", "total", "rerank"))),
        result_cache=payload.get("result_cache", "off"),
        mode=payload.get("mode", "dense"),
        fallback=payload.get("fallback"),
        groups=None if groups is None else tuple(SearchGroup(str(g["source"]), tuple(g["ids"])) for g in groups),
        reranked_by=payload.get("reranked_by"),
        rerank_fallback=payload.get("rerank_fallback"),
    )


def _parse_rerank(payload: dict) -> RerankResult:
    hits = tuple(RerankHit(int(item["index"]), float(item["relevance_score"])) for item in payload["results"])
    return RerankResult(str(payload.get("model", "")), hits, {str(k): int(v) for k, v in (payload.get("served") or {}).items()})


def _parse_search_batch(payload: dict) -> list[SearchResult]:
    return [_parse_search(result) for result in payload["results"]]


def _parse_dataclass(cls: type, payload: dict) -> Any:
    # Unknown fields are ignored, so a newer server that reports more does not break an older client.
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in payload.items() if name in names})


def _parse_ids(payload: dict) -> list[str]:
    return [str(doc_id) for doc_id in payload["ids"]]


def _parse_documents(payload: dict) -> list[Document]:
    return [Document(str(d["id"]), str(d["text"]), dict(d.get("metadata") or {})) for d in payload["documents"]]


def _parse_num_deleted(payload: dict) -> int:
    return int(payload["num_deleted"])


def _parse_collections(payload: dict | list) -> list[CollectionInfo]:
    items = payload["collections"] if isinstance(payload, dict) else payload
    return [_parse_dataclass(CollectionInfo, item) for item in items]


def _parse_object(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise TypeError(f"expected a JSON object, got {type(payload).__name__}")
    return payload


def _parse_nothing(payload: Any) -> None:
    return None


def _parse_prefixes(payload: list) -> list[Prefix]:
    return [Prefix.from_json(item) for item in payload]


def _parse_warm(payload: dict) -> WarmResult:
    result = _parse_dataclass(WarmResult, payload)
    return dataclasses.replace(result, outcome=WarmOutcome(result.outcome))


def _parse_register(payload: dict) -> RegisterResult:
    warm = payload.get("warm")
    return RegisterResult(
        prefix=Prefix.from_json(payload["prefix"]),
        created=bool(payload["created"]),
        new_version=bool(payload["new_version"]),
        warnings=tuple(payload.get("warnings") or ()),
        warm=_parse_warm(warm) if warm is not None else None,
        warms=tuple(_parse_warm(item) for item in payload.get("warms") or ()),
    )

