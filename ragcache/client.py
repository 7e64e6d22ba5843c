"""A Python client for the ragcache HTTP service: ``Client`` (blocking) and ``AsyncClient`` (asyncio), over httpx.

    >>> with Client("http://127.0.0.1:8000", api_key="secret") as client:
    ...     vectors = client.embed(["What is a KV cache?"])  # numpy float32 [1, 384]
    ...     client.search("What is a KV cache?", "docs", top_k=3).hits[0].text

    >>> async with AsyncClient() as client:
    ...     vectors = await client.embed(["What is a KV cache?"])

The KV-prefix registry's operations are here too (``register_prefix``, ``get_prefix``, ``warm_prefix``, ...),
and ``render``/``messages`` build prompts locally from a registered prefix, byte for byte prefix-first, with
retrieved chunks in a cache-friendly order (:func:`ragcache.prefixes.assemble_prompt`); the prefix is fetched
once per ``prefix_refresh_s`` and uses are reported in batches (on refresh, or :meth:`flush_uses`).

Every operation is written once (``_Operations``): it builds a ``_Call`` (method, path, JSON body, how to
read the answer), and each class only sends it, so the two clients cannot drift apart. ``transport=`` is
the test seam (``httpx.MockTransport``, ``httpx.ASGITransport``).

Errors are the library's own tree, carrying the server's message and a ``status_code`` attribute:

    RagCacheError
    ├── InvalidInputError        400, 413, 422 (``field`` as the server named it)
    ├── NotFoundError            404
    ├── ConflictError            409
    ├── AuthenticationError      401, 403                                          (defined here)
    ├── ServiceUnavailableError  cannot connect, timed out, 429 or 502/503/504       (defined here)
    └── ServiceError             any other failed answer, or one that is not the expected JSON (defined here)

Connection failures and 429/502/503 answers are retried ``retries`` times with exponential back-off, or
after the ``Retry-After`` the service sent when that is longer (capped at ``MAX_RETRY_AFTER_S``): nothing
reached the application, or it asked to be retried. Every endpoint is idempotent (upserts and deletes
go by id), but a read timeout is not retried (the request may still be running), nor is any 4xx, which is
the caller's to fix.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from ragcache.errors import (
    AuthenticationError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    RagCacheError,
    ServiceError,
    ServiceUnavailableError,
)
from ragcache.outbound import retry_after_s
from ragcache.prefixes.model import MAX_USES_PER_REPORT, Prefix, PromptForm, RegisterResult, Target, WarmOutcome, WarmResult, check_name
from ragcache.prefixes.text import Chunk, assemble_prompt, render_messages, render_text
from ragcache.redact import redact_text, redact_url
from ragcache.rerank.base import RerankHit, RerankResult
from ragcache.retrieval.documents import Document, check_collection_name
from ragcache.retrieval.ranking import SearchOptions
from ragcache.retrieval.results import CollectionInfo, IngestResult, SearchGroup, SearchHit, SearchResult, SearchTimings

__all__ = [
    "Client",
    "AsyncClient",
    "SearchResponse",
    "SearchOptions",
    "AuthenticationError",
    "ServiceUnavailableError",
    "ServiceError",
    "DEFAULT_BASE_URL",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = frozenset({429, 502, 503})
# A Retry-After longer than this is not waited for: the error goes to the caller, who knows its own deadline.
MAX_RETRY_AFTER_S = 30.0
# The search answer of the service is the library's SearchResult, field for field.
SearchResponse = SearchResult


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: Any
    parse: Callable[[Any], Any]  # the decoded JSON answer -> the value the operation returns


class _Operations:
    """The service's operations, shared by both clients. In ``AsyncClient`` each returns an awaitable."""

    model: str | None
    _http_class: type

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        retries: int = 2,
        backoff_s: float = 0.1,
        model: str | None = None,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        prefix_refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``api_key`` is sent as ``Authorization: Bearer``; ``timeout`` in seconds; ``retries`` after a
        connection failure or a 429/502/503, waiting ``backoff_s`` doubled each time (or the answer's
        ``Retry-After``, when longer); ``model`` is sent with
        embedding, search and ingest requests (the service's default model when None); ``transport`` replaces the network;
        ``prefix_refresh_s`` is how long ``render`` reuses a fetched prefix (``clock`` measures it)."""
        if retries < 0 or backoff_s < 0:
            raise InvalidInputError("retries and backoff_s must not be negative", field="retries")
        self.base_url = base_url
        self.retries = retries
        self.backoff_s = backoff_s
        self.model = model
        self._prefixes = _PrefixCache(prefix_refresh_s, clock)
        headers = {"User-Agent": "ragcache-client"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = self._http_class(base_url=base_url, headers=headers, timeout=timeout, transport=transport)

    def _call(self, call: _Call) -> Any:
        raise NotImplementedError

    def embed(self, texts: str | Sequence[str], *, prompt_name: str | None = None) -> np.ndarray:
        """One float32 vector per text, ``[len(texts), dim]`` (a single string counts as one text).
        ``prompt_name``: one of the model's named prompts (e.g. ``query``, ``document``; ``info()`` lists them).

        Vectors travel base64-encoded (little-endian float32), about 4x smaller and faster than JSON floats.
        """
        items = [texts] if isinstance(texts, str) else list(texts)
        body = self._with_model({"input": items, "encoding_format": "base64"})
        if prompt_name is not None:
            body["prompt_name"] = prompt_name
        return self._call(_Call("POST", "/v1/embeddings", body, functools.partial(_parse_embeddings, len(items))))

    def search(
        self,
        query: str,
        collection: str,
        top_k: int = 10,
        filter: str | None = None,  # noqa: A002 - the API's name
        options: SearchOptions | None = None,
        rerank: Mapping[str, Any] | None = None,
        include_text: bool = True,
    ) -> SearchResult:
        """The ``top_k`` documents of ``collection`` nearest to ``query``; ``filter`` is a Milvus expression
        on the documents, e.g. ``metadata["lang"] == "en"``; ``options`` picks the mode (dense, keyword,
        hybrid), fusion, paging, threshold, MMR and grouping; ``rerank`` (``{"top_n", "model"}``) reorders the
        hits by a served reranker (``reranked_by``; ``rerank_fallback`` says why not, when it could not).
        ``include_text=False``: hits without their text (``text`` is ""), a far smaller answer."""
        body = self._with_model({"query": query, "collection": collection, "top_k": top_k, "filter": filter, **_options_body(options)})
        return self._call(_Call("POST", "/search", _with_hit_options(body, rerank, include_text), _parse_search))

    def rerank(self, query: str, texts: Sequence[str], *, top_n: int | None = None, model: str | None = None) -> RerankResult:
        """The texts' indexes sorted by relevance to ``query``, best first (``top_n``: the best n only);
        ``model`` names a served reranker (default: the server's first). ``served`` counts cached scores."""
        # The Cohere shape: its answer is an object, which carries the served counts (TEI's is a bare list).
        body: dict[str, Any] = {"query": query, "documents": list(texts), "top_n": top_n, "model": model}
        return self._call(_Call("POST", "/rerank", body, _parse_rerank))

    def search_many(
        self,
        queries: Sequence[str],
        collection: str,
        top_k: int = 10,
        filter: str | None = None,  # noqa: A002 - the API's name
        options: SearchOptions | None = None,
        rerank: Mapping[str, Any] | None = None,
        include_text: bool = True,
    ) -> list[SearchResult]:
        """``search`` for several queries in one request (``POST /search/batch``); results in query order. The
        service bounds the whole answer (``RAGCACHE_MAX_ANSWER_BYTES``): ``include_text=False`` keeps it small."""
        body = {"queries": list(queries), "collection": collection, "top_k": top_k, "filter": filter, **_options_body(options)}
        body = _with_hit_options(self._with_model(body), rerank, include_text)
        return self._call(_Call("POST", "/search/batch", body, _parse_search_batch))

    def add_documents(
        self, collection: str, documents: Sequence[Mapping[str, Any] | Any], *, sync: Mapping[str, Any] | None = None
    ) -> IngestResult:
        """Embed and upsert documents (``{"id", "text", "metadata"}`` mappings or ``Document``s) by id; a document
        stored with the same text and metadata is skipped. ``sync`` (``{"cleanup": "incremental" | "full",
        "scope": filter}``, an admin key) also deletes what is gone from the source (``ragcache.retrieval.sync``)."""
        rows = [dataclasses.asdict(doc) if dataclasses.is_dataclass(doc) else dict(doc) for doc in documents]  # type: ignore[arg-type]
        body = self._with_model({"collection": collection, "documents": rows})
        if sync is not None:
            body["sync"] = dict(sync)
        return self._call(_Call("POST", "/documents", body, functools.partial(_parse_dataclass, IngestResult)))

    def list_ids(self, collection: str, filter: str | None = None) -> list[str]:  # noqa: A002 - the API's name
        """The ids of the collection's documents (matching ``filter``, a Milvus expression)."""
        body = {"collection": collection, "filter": filter}
        return self._call(_Call("POST", "/documents/ids", body, _parse_ids))

    def get_documents(self, collection: str, ids: Sequence[str]) -> list[Document]:
        """The documents with these ids, in the order asked; ids the collection does not hold are left out."""
        body = {"collection": collection, "ids": list(ids)}
        return self._call(_Call("POST", "/documents/get", body, _parse_documents))

    def drop_collection(self, collection: str) -> None:
        """Drop a collection and all its documents (an ``admin`` key; ``NotFoundError`` when it does not exist)."""
        # Checked here too: the name goes into the path, where a '/' or '?' would name another route.
        path = f"/collections/{check_collection_name(collection)}"
        return self._call(_Call("DELETE", path, None, lambda payload: None))

    def delete_documents(self, collection: str, ids: Sequence[str]) -> int:
        """Delete documents by id; returns how many existed."""
        body = {"collection": collection, "ids": list(ids)}
        return self._call(_Call("DELETE", "/documents", body, _parse_num_deleted))

    def collections(self) -> list[CollectionInfo]:
        """Every collection: name, embedding space, number of documents."""
        return self._call(_Call("GET", "/collections", None, _parse_collections))

    def stats(self) -> dict[str, Any]:
        """The service's hit rates, latencies and counters, as it reports them."""
        return self._call(_Call("GET", "/stats", None, _parse_object))

    def health(self) -> dict[str, Any]:
        """The service's health report (raises ``ServiceUnavailableError`` when it answers 503)."""
        return self._call(_Call("GET", "/health", None, _parse_object))

    def info(self) -> dict[str, Any]:
        """Models, embedding spaces and settings the service runs with."""
        return self._call(_Call("GET", "/info", None, _parse_object))

    # ---- the KV-prefix registry -----------------------------------------------------------------------

    def register_prefix(self, name: str, text: str, target: Target, *, is_template: bool = False,
                        form: PromptForm | str = PromptForm.COMPLETION, lmcache_controller_url: str | None = None,
                        pinned: bool = True, endpoints: Sequence[str] = ()) -> RegisterResult:
        """Register (or re-register) a prefix: the stored prefix, warnings about its text, and its first warms.
        ``endpoints``: more vLLM replicas (base URLs) serving ``target.model`` to keep it warm on."""
        body = {"name": check_name(name), "text": text, "target": {"base_url": target.base_url, "model": target.model},
                "is_template": is_template, "form": PromptForm(form).value,
                "lmcache_controller_url": lmcache_controller_url, "pinned": pinned, "endpoints": list(endpoints)}
        return self._call(_Call("POST", "/prefixes", body, _parse_register))

    def list_prefixes(self) -> list[Prefix]:
        """Every registered prefix, by name."""
        return self._call(_Call("GET", "/prefixes", None, _parse_prefixes))

    def get_prefix(self, name: str) -> Prefix:
        """The current version of prefix ``name`` (``NotFoundError`` when there is none)."""
        return self._call(_Call("GET", _prefix_path(name), None, Prefix.from_json))

    def delete_prefix(self, name: str) -> None:
        """Forget prefix ``name``; it is no longer warmed."""
        return self._call(_Call("DELETE", _prefix_path(name), None, _parse_nothing))

    def warm_prefix(self, name: str, endpoint: str | None = None) -> WarmResult:
        """Warm prefix ``name`` now on ``endpoint`` (default: its target), within the service's warm budget; the
        outcome says what happened."""
        query = "" if endpoint is None else f"?endpoint={quote(endpoint, safe='')}"
        return self._call(_Call("POST", _prefix_path(name, "/warm") + query, None, _parse_warm))

    def prefix_stats(self, name: str) -> dict[str, Any]:
        """The service's counters of prefix ``name`` (warms, residency, uses), as it reports them."""
        return self._call(_Call("GET", _prefix_path(name, "/stats"), None, _parse_object))

    def report_uses(self, name: str, count: int) -> None:
        """Tell the service that ``count`` requests were built with prefix ``name``."""
        return self._call(_Call("POST", _prefix_path(name, "/uses"), {"count": count}, _parse_nothing))

    # ---- shared by both senders -----------------------------------------------------------------------

    def _with_model(self, body: dict[str, Any]) -> dict[str, Any]:
        # The model picks the embedding space on the server; unset, the server's default model serves.
        return body if self.model is None else {**body, "model": self.model}

    def _settle(self, call: _Call, attempt: int, outcome: httpx.Response | Exception) -> tuple[float | None, Any]:
        """What one attempt's outcome means: (seconds to wait before retrying, None), or (None, the value).
        Raises the library's error when the outcome is a final failure."""
        delay = self._retry_delay(attempt, outcome)
        if delay is not None:
            return delay, None
        if isinstance(outcome, Exception):
            raise self._transport_error(call, outcome) from outcome
        return None, _finish(call, outcome)

    def _retry_delay(self, attempt: int, outcome: httpx.Response | Exception) -> float | None:
        """Seconds to wait before trying again, or None when this outcome is final."""
        if isinstance(outcome, httpx.Response):
            retryable = outcome.status_code in RETRY_STATUSES
        else:
            # Only failures where the request cannot have reached the application.
            retryable = isinstance(outcome, (httpx.ConnectError, httpx.ConnectTimeout))
        if not retryable or attempt >= self.retries:
            return None
        delay = self.backoff_s * 2**attempt
        retry_after = retry_after_s(outcome.headers) if isinstance(outcome, httpx.Response) else None
        if retry_after is None:
            return delay
        return max(delay, retry_after) if retry_after <= MAX_RETRY_AFTER_S else None

    def _transport_error(self, call: _Call, exc: Exception) -> RagCacheError:
        if isinstance(exc, (TypeError, ValueError)):
            # httpx serialises the body while building the request: a value JSON cannot hold.
            return InvalidInputError(f"{call.method} {call.path}: the request is not valid JSON: {exc}")
        reason = "timed out" if isinstance(exc, httpx.TimeoutException) else "cannot be reached"
        shown = redact_text(repr(exc), self.base_url)
        return ServiceUnavailableError(f"{call.method} {call.path}: ragcache at {redact_url(self.base_url)} {reason}: {shown}")


class Client(_Operations):
    """A blocking client. Thread-safe (one connection pool); close it, or use it as a context manager."""

    _http_class = httpx.Client

    def _call(self, call: _Call) -> Any:
        for attempt in itertools.count():
            try:
                outcome = self._http.request(call.method, call.path, json=call.body)
            except (httpx.HTTPError, TypeError, ValueError) as exc:
                outcome = exc
            delay, value = self._settle(call, attempt, outcome)
            if delay is None:
                return value
            time.sleep(delay)

    def render(self, name: str, *, chunks: Iterable[Chunk] = (), volatile: str = "", **slots: Any) -> str:
        """The prompt for prefix ``name``, built here: its text (``slots`` filled into a template), then
        ``chunks`` (search hits) by id, then ``volatile`` (the question, a date) last, so consecutive requests
        share the longest possible prefix in vLLM's cache (:func:`ragcache.prefixes.assemble_prompt`)."""
        return assemble_prompt(render_text(self._prefix(name), slots), chunks, volatile)

    def messages(self, name: str, user: str, *, chunks: Iterable[Chunk] = (), **slots: Any) -> list[dict[str, str]]:
        """Chat form of :meth:`render`: the prefix (and ``chunks``) as the system message, then ``user``."""
        return _with_chunks(render_messages(self._prefix(name), user, slots), chunks)

    def flush_uses(self) -> None:
        """Report the uses counted by ``render``/``messages`` since the last report."""
        for name, count in self._prefixes.take_reports():
            self.report_uses(name, count)

    def _prefix(self, name: str) -> Prefix:
        prefix = self._prefixes.fresh(name)
        if prefix is None:
            self.flush_uses()
            prefix = self._prefixes.keep(self.get_prefix(name))
        self._prefixes.pending_uses[name] += 1
        return prefix

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class AsyncClient(_Operations):
    """An asyncio client: every operation returns an awaitable. Close it with ``aclose`` or ``async with``."""

    _http_class = httpx.AsyncClient

    async def _call(self, call: _Call) -> Any:
        for attempt in itertools.count():
            try:
                outcome = await self._http.request(call.method, call.path, json=call.body)
            except (httpx.HTTPError, TypeError, ValueError) as exc:
                outcome = exc
            delay, value = self._settle(call, attempt, outcome)
            if delay is None:
                return value
            await asyncio.sleep(delay)

    async def render(self, name: str, *, chunks: Iterable[Chunk] = (), volatile: str = "", **slots: Any) -> str:
        """As :meth:`Client.render`."""
        return assemble_prompt(render_text(await self._prefix(name), slots), chunks, volatile)

    async def messages(self, name: str, user: str, *, chunks: Iterable[Chunk] = (),
                       **slots: Any) -> list[dict[str, str]]:
        """As :meth:`Client.messages`."""
        return _with_chunks(render_messages(await self._prefix(name), user, slots), chunks)

    async def flush_uses(self) -> None:
        """As :meth:`Client.flush_uses`."""
        for name, count in self._prefixes.take_reports():
            await self.report_uses(name, count)  # type: ignore[func-returns-value, misc]

    async def _prefix(self, name: str) -> Prefix:
        prefix = self._prefixes.fresh(name)
        if prefix is None:
            await self.flush_uses()
            prefix = self._prefixes.keep(await self.get_prefix(name))  # type: ignore[misc]
        self._prefixes.pending_uses[name] += 1
        return prefix

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()


class _PrefixCache:
    """Prefixes fetched for ``render`` (with their fetch time), and the uses not yet reported."""

    def __init__(self, refresh_s: float, clock: Callable[[], float]) -> None:
        self._refresh_s = refresh_s
        self._clock = clock
        self._fetched: dict[str, tuple[Prefix, float]] = {}
        self.pending_uses: collections.Counter[str] = collections.Counter()

    def fresh(self, name: str) -> Prefix | None:
        entry = self._fetched.get(name)
        return entry[0] if entry and self._clock() - entry[1] < self._refresh_s else None

    def keep(self, prefix: Prefix) -> Prefix:
        self._fetched[prefix.name] = (prefix, self._clock())
        return prefix

    def take_reports(self) -> list[tuple[str, int]]:
        """The uses not yet reported, as (name, count) reports of at most ``MAX_USES_PER_REPORT`` each."""
        pending, self.pending_uses = self.pending_uses, collections.Counter()
        return [(name, min(MAX_USES_PER_REPORT, count - start))
                for name, count in pending.items() for start in range(0, count, MAX_USES_PER_REPORT)]


def _prefix_path(name: str, suffix: str = "") -> str:
    # The name is checked and escaped: it goes into the path, where "x/../../stats" would reach another
    # route with the caller's key.
    return f"/prefixes/{quote(check_name(name), safe='')}{suffix}"


def _with_chunks(messages: list[dict[str, str]], chunks: Iterable[Chunk]) -> list[dict[str, str]]:
    system, *rest = messages
    return [{**system, "content": assemble_prompt(system["content"], chunks)}, *rest]


# ---- reading answers ----------------------------------------------------------------------------------------


def _finish(call: _Call, response: httpx.Response) -> Any:
    """The operation's value from a final answer, or the error it stands for."""
    if not response.is_success:
        raise _status_error(response)
    try:
        return call.parse(response.json() if response.content else None)
    except (ValueError, TypeError, KeyError, IndexError, binascii.Error) as exc:
        raise ServiceError(f"{call.method} {call.path}: unexpected answer from the service: {exc!r}") from exc


def _status_error(response: httpx.Response) -> RagCacheError:
    message, field = _error_details(response)
    status = response.status_code
    error: RagCacheError
    if status in (400, 413, 422):
        error = InvalidInputError(message, field=field)
    elif status == 404:
        error = NotFoundError(message)
    elif status == 409:
        error = ConflictError(message)
    elif status in (401, 403):
        error = AuthenticationError(message)
    elif status in (429, 502, 503, 504):
        error = ServiceUnavailableError(message)
    else:
        error = ServiceError(message)
    error.status_code = status  # type: ignore[union-attr]
    return error


def _error_details(response: httpx.Response) -> tuple[str, str | None]:
    """(message, field) from ``{"error": {...}}``, FastAPI's ``{"detail": ...}``, or the raw text."""
    fallback = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    try:
        payload = response.json()
    except ValueError:
        return (response.text.strip()[:1000] or fallback), None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"]), error.get("field")
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
        return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4").astype(np.float32)
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
