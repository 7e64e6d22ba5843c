"""A knowledge base's searches: planned (every argument checked before Milvus is asked), answered from the result
cache when it holds them, else ranked dense, by keyword (BM25) or both (``ragcache.retrieval.ranking``).

A failing keyword index has a breaker of its own: the search falls back to dense and says so (``fallback``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragcache.core.cache import EmbeddingCache
from ragcache.core.health import TierHealth
from ragcache.core.keys import EmbeddingSpace
from ragcache.errors import ConflictError, InvalidInputError, TierUnavailableError
from ragcache.retrieval.catalog import METRIC, Catalog, CollectionRecord, check_space
from ragcache.retrieval.documents import check_filter, check_query, check_top_k
from ragcache.retrieval.gateway import converted
from ragcache.retrieval.keyword import SPARSE_FIELD, keyword_search_params
from ragcache.retrieval.names import CollectionName
from ragcache.retrieval.ranking import SearchOptions, finish, fuse, group_hits
from ragcache.retrieval.result_cache import ResultCache
from ragcache.retrieval.results import SearchHit, SearchResult, SearchTimings
from ragcache.storage.milvus_errors import milvus_failures

__all__ = ["MAX_QUERIES", "Searcher"]

MAX_QUERIES = 256  # queries in one search_many call
KEYWORD_STORE = "keyword index"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Plan:
    """A search's checked arguments."""

    meta: CollectionRecord
    queries: list[str]
    query_keys: list[str]
    params: str  # the result-cache key's parameters: top_k, filter and every option
    expression: str | None
    top_k: int
    options: SearchOptions
    query_cache: EmbeddingCache


@dataclass(frozen=True)
class _Ranked:
    """One query's hits from one ranked list, and their vectors when MMR asked for them."""

    hits: tuple[SearchHit, ...]
    vectors: dict[str, np.ndarray]


class Searcher:
    """Searches of the catalog's collections, their results cached in ``results`` (None: not cached)."""

    def __init__(self, catalog: Catalog, results: ResultCache | None, *, max_top_k: int, clock: Callable[[], float]):
        self.catalog = catalog
        self.results = results
        self.max_top_k = max_top_k
        self._clock = clock
        self.keyword_health = TierHealth()  # the keyword (BM25) searches' own: dense search goes on without them

    def search_many(self, collection: str | CollectionName, queries: Sequence[str], cache: EmbeddingCache,
                    query_cache: EmbeddingCache | None, top_k: int, filter: str | None,  # noqa: A002
                    options: SearchOptions | None, with_text: bool) -> list[SearchResult]:
        """``KnowledgeBase.search_many`` (which holds the defaults): one embedding batch and one Milvus search per
        ranked list for all the queries; each query's result is cached on its own."""
        plan = self._plan(collection, queries, cache, query_cache, top_k, filter, options, self.catalog.lookup)
        assert plan is not None  # lookup finds the collection or raises
        started = self._clock()
        results: list[SearchResult | None] = [None] * len(plan.queries)
        versions: list[int | None] = [None] * len(plan.queries)
        if self.results is not None:
            for index, query_key in enumerate(plan.query_keys):
                cached, versions[index] = self.results.get(plan.meta.uid, query_key, plan.params)
                if cached is not None:
                    results[index] = self._cached_result(cached, started, plan.options)
        fresh = [index for index, result in enumerate(results) if result is None]
        if fresh:
            for index, result in zip(fresh, self._search_fresh(plan, fresh, started, with_text)):
                version = versions[index]
                results[index] = dataclasses.replace(result, result_cache="off" if version is None else "miss")
                # A degraded answer is not kept, nor one without its texts (a later caller may want them).
                if version is not None and self.results is not None and result.fallback is None and with_text:
                    value = [[h.id, h.score, h.text, h.metadata] for h in result.hits]
                    self.results.put(plan.meta.uid, version, plan.query_keys[index], plan.params, value)
        return [result for result in results if result is not None]  # every one is set by now

    async def search_cached(self, collection: str | CollectionName, query: str, cache: EmbeddingCache,
                            query_cache: EmbeddingCache | None, top_k: int, filter: str | None,  # noqa: A002
                            options: SearchOptions | None) -> SearchResult | None:
        """``KnowledgeBase.search_cached``: the cached result, found without blocking, or None."""
        if self.results is None:
            return None
        plan = self._plan(collection, [query], cache, query_cache, top_k, filter, options, self.catalog.known)
        if plan is None:
            return None  # not yet known in this process: finding it asks Milvus, which blocks
        started = self._clock()
        cached = await self.results.aget(plan.meta.uid, plan.query_keys[0], plan.params)
        return None if cached is None else self._cached_result(cached, started, plan.options)

    def _plan(self, collection, queries, cache, query_cache, top_k, filter, options, find) -> _Plan | None:  # noqa: A002
        """The search's checked arguments (every one checked before Milvus is asked); None when ``find``
        does not know the collection."""
        name = CollectionName.of(collection)
        checked = _check_queries(queries)
        top_k = check_top_k(top_k, self.max_top_k)
        expression = check_filter(filter)
        options = options or SearchOptions()
        query_cache = query_cache or cache
        _check_query_space(cache.space, query_cache.space)
        meta = find(name)
        if meta is None:
            return None
        check_space(meta, cache.space)
        if options.uses_keyword and not meta.keyword:
            raise InvalidInputError(
                f"mode={options.mode!r} needs a keyword index, and collection {meta.public!r} was created without one "
                "(before ragcache kept one): search it with mode='dense', or ingest into a new collection",
                field="mode",
            )
        query_keys = query_cache.space.keys(query_cache.space.prepare(checked))
        params = json.dumps([top_k, expression, options.key()], sort_keys=True)
        return _Plan(meta, checked, query_keys, params, expression, top_k, options, query_cache)

    def _search_fresh(self, plan: _Plan, fresh: list[int], started: float, with_text: bool) -> list[SearchResult]:
        """Search Milvus for the queries at ``fresh``: the keyword list first (so that its failure can turn
        the search dense before anything is embedded), then the query vectors and the dense list."""
        meta, options, texts = plan.meta, plan.options, [plan.queries[index] for index in fresh]
        limit, with_vectors = options.num_candidates(plan.top_k), options.mmr_lambda is not None
        keyword: list[_Ranked] = [_Ranked((), {})] * len(texts)
        fallback = None
        search_s = 0.0
        if options.uses_keyword:
            keyword_started = self._clock()
            try:
                keyword = self._ranked(meta, SPARSE_FIELD, texts, limit, plan.expression, with_vectors, with_text)
            except TierUnavailableError as exc:
                fallback = f"keyword search failed, so dense search answered: {exc}"
                log.warning("collection %r: %s", meta.name, fallback)
                options = dataclasses.replace(options, mode="dense")
            search_s += self._clock() - keyword_started
        embed_started = self._clock()
        levels: list[str | None] = [None] * len(texts)
        vectors = None
        if options.uses_dense or with_vectors:
            embedded = plan.query_cache.embed_detailed(texts)
            vectors = np.asarray(embedded.vectors, dtype=np.float32)  # Milvus searches float32 vectors
            levels = [embedded.level_names[int(level)] for level in embedded.levels]
        dense_started = self._clock()
        dense: list[_Ranked] = [_Ranked((), {})] * len(texts)
        if options.uses_dense and vectors is not None:
            dense = self._ranked(meta, "vector", list(vectors), limit, plan.expression, with_vectors, with_text)
        finished = self._clock()
        search_s += finished - dense_started
        timings = SearchTimings(embed=_ms(dense_started - embed_started), search=_ms(search_s), total=_ms(finished - started))
        results = []
        for position in range(len(texts)):
            ranked = fuse(options, dense[position].hits, keyword[position].hits)
            hits = finish(
                options,
                ranked,
                plan.top_k,
                query_vector=None if vectors is None else vectors[position],
                vectors={**keyword[position].vectors, **dense[position].vectors},
            )
            groups = group_hits(hits, options.group_size) if options.group_by_source else None
            results.append(SearchResult(hits, levels[position], timings, "miss", options.mode, fallback, groups))
        return results

    def _cached_result(self, cached, started: float, options: SearchOptions) -> SearchResult | None:
        hits = _hits_from_json(cached)
        if hits is None:
            return None
        elapsed_ms = _ms(self._clock() - started)
        groups = group_hits(hits, options.group_size) if options.group_by_source else None
        return SearchResult(hits, None, SearchTimings(0.0, elapsed_ms, elapsed_ms), "hit", options.mode, None, groups)

    def _ranked(
        self, meta: CollectionRecord, field: str, data: list, limit: int, expression: str | None, with_vectors: bool,
        with_text: bool = True,
    ) -> list[_Ranked]:
        """One ranked list per query: the nearest rows of ``field`` (``vector``: cosine; the sparse field:
        BM25 of the query's text), with their vectors when asked (for MMR), without their texts when not."""
        output_fields = ["id", *(["text"] if with_text else []), "metadata", *(["vector"] if with_vectors else [])]
        arguments: dict[str, Any] = dict(data=data, anns_field=field, limit=limit, filter=expression or "", output_fields=output_fields)
        if field == SPARSE_FIELD:
            rows_per_query = self._keyword_search(meta, filter_given=expression is not None, **arguments)
        else:
            arguments["search_params"] = {"metric_type": METRIC}
            rows_per_query = self.catalog.call(meta, "search", meta.milvus_name, filter_given=expression is not None, **arguments)
        ranked = []
        for rows in rows_per_query:
            hits = tuple(
                SearchHit(row["entity"]["id"], float(row["distance"]), row["entity"].get("text", ""), row["entity"].get("metadata") or {})
                for row in rows
            )
            vectors = (
                {row["entity"]["id"]: np.asarray(row["entity"]["vector"], dtype=np.float32) for row in rows}
                if with_vectors
                else {}
            )
            ranked.append(_Ranked(hits, vectors))
        return ranked

    def _keyword_search(self, meta: CollectionRecord, *, filter_given: bool, **arguments) -> Any:
        """A BM25 search, behind a breaker of its own: a failing keyword index makes searches fall back to
        dense (``TierUnavailableError`` here), and must not mark Milvus down while dense search still works.
        While it is down, keyword searches fall back at once, and one per back-off probes it."""
        if not self.keyword_health.should_try():
            raise TierUnavailableError(KEYWORD_STORE, f"down, retried with back-off: {self.keyword_health.last_error}")
        try:
            rows = self.catalog.gateway.milvus.search(meta.milvus_name, search_params=keyword_search_params(), **arguments)
        except milvus_failures as exc:
            error = converted(exc, meta.public, filter_given=filter_given)
            if isinstance(error, TierUnavailableError) and self.keyword_health.record_failure(error):
                log.warning("keyword index of %r is failing; keyword searches fall back to dense: %s", meta.name, error)
            raise error from exc
        if self.keyword_health.record_success():
            log.warning("keyword index of %r is back", meta.name)
        return rows


def _check_queries(queries: object) -> list[str]:
    """Valid queries; one query is named ``query`` (``search``), several ``queries[i]`` (``search_many``)."""
    if isinstance(queries, str) or not isinstance(queries, Sequence) or not 1 <= len(queries) <= MAX_QUERIES:
        raise InvalidInputError(f"queries must be a list of 1 to {MAX_QUERIES} strings", field="queries")
    if len(queries) == 1:
        return [check_query(queries[0])]
    checked = []
    for index, query in enumerate(queries):
        try:
            checked.append(check_query(query))
        except InvalidInputError as exc:
            raise InvalidInputError(str(exc).replace("query", f"queries[{index}]", 1), field=f"queries[{index}]") from exc
    return checked


def _check_query_space(space: EmbeddingSpace, query_space: EmbeddingSpace) -> None:
    """A query cache must be the documents' model and settings, differing at most in the prompt."""
    if dataclasses.replace(query_space, prompt=None) != dataclasses.replace(space, prompt=None):
        raise ConflictError(
            f"the query is embedded in space {query_space.space_id} ({query_space.model}), which is not the "
            f"documents' space {space.space_id} ({space.model}) under another prompt: their vectors cannot be compared"
        )


def _hits_from_json(value: Any) -> tuple[SearchHit, ...] | None:
    """Hits from a cached result list; None when the value is not one (then the search runs)."""
    try:
        return tuple(SearchHit(str(i), float(s), str(t), dict(m)) for i, s, t, m in value)
    except (TypeError, ValueError):
        return None


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
