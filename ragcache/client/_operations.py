"""Every operation of the service, written once: each builds a ``_Call`` that the blocking and the asyncio client only send."""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from ragcache.client._wire import (
    _Call,
    _finish,
    _options_body,
    _parse_collections,
    _parse_dataclass,
    _parse_documents,
    _parse_embeddings,
    _parse_ids,
    _parse_nothing,
    _parse_num_deleted,
    _parse_object,
    _parse_prefixes,
    _parse_register,
    _parse_rerank,
    _parse_search,
    _parse_search_batch,
    _parse_warm,
    _prefix_path,
    _with_hit_options,
)
from ragcache.errors import (
    InvalidInputError,
    RagCacheError,
    ServiceUnavailableError,
)
from ragcache.observe.redact import redact_text, redact_url
from ragcache.outbound import retry_after_s
from ragcache.prefixes.model import MAX_USES_PER_REPORT, Prefix, PromptForm, Target, check_name
from ragcache.prefixes.results import RegisterResult, WarmResult
from ragcache.rerank.base import RerankResult
from ragcache.retrieval.documents import Document, check_collection_name
from ragcache.retrieval.ranking import SearchOptions
from ragcache.retrieval.results import CollectionInfo, IngestResult, SearchResult

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = frozenset({429, 502, 503})
# A Retry-After longer than this is not waited for: the error goes to the caller, who knows its own deadline.
MAX_RETRY_AFTER_S = 30.0



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
        if httpx.URL(base_url).userinfo:
            # httpx would send the user info as Basic auth in place of the Bearer key (a 401), and it would show
            # wherever the URL is printed.
            raise InvalidInputError(f"base_url {redact_url(base_url)!r} carries credentials (user:password@): "
                                    "give the key as api_key (RAGCACHE_API_KEY for the CLI) instead", field="base_url")
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

    def embed(self, texts: str | Sequence[str], *, prompt_name: str | None = None, input_type: str | None = None) -> np.ndarray:
        """One float32 vector per text, ``[len(texts), dim]`` (a single string counts as one text).
        ``input_type``: ``"query"`` or ``"document"``, the vectors ``/search`` embeds a query with and ``/documents``
        stores a document with (the model's prompt of that name; a model without one embeds the text as is).
        ``prompt_name``: one of the model's named prompts (``info()`` lists them), refused when the model lacks it.

        Vectors travel base64-encoded (little-endian float32), about 4x smaller and faster than JSON floats.
        """
        items = [texts] if isinstance(texts, str) else list(texts)
        body = self._with_model({"input": items, "encoding_format": "base64"})
        if prompt_name is not None:
            body["prompt_name"] = prompt_name
        if input_type is not None:
            body["input_type"] = input_type
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

    def route_prefix(self, name: str) -> dict[str, Any]:
        """Where a request built on prefix ``name`` should go: ``endpoint`` (a vLLM base URL), ``reason`` and each
        candidate's figures, as ``POST /prefixes/{name}/route`` answers (by the engines' KV events, else by load)."""
        return self._call(_Call("POST", _prefix_path(name, "/route"), None, _parse_object))

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
        return None, _finish(call, outcome, sent_key="Authorization" in self._http.headers)

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
