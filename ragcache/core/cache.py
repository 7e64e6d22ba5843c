"""The embedding cache, a facade over a walk that goes one way: a request's texts are prepared and hashed once,
its distinct keys walk the levels (``Levels.walk``: each asked only for what is still missing, hits written back
into the levels above), and what no level holds goes to the ``MissResolver`` (computed once per key, batched
across callers, once across processes with single flight). Neither calls back up into the facade.

One cache per model serves every ``Scope`` (a tenant's keys, a named prompt): a request carries its scope
(``scope=``, or a view's, ``scoped``), which selects its space and so its keys (``ragcache.core.scope``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ragcache.core.batching import CallsInProgress
from ragcache.core.causes import MissLedger
from ragcache.core.encoder import Encoder, capabilities_of
from ragcache.core.flight import Flight
from ragcache.core.keys import EmbeddingSpace, Generation, KeyList, KeyMemo
from ragcache.core.levels import Found, Levels
from ragcache.core.misses import ComputeConfig, MissResolver
from ragcache.core.result import EmbedResult, Probe, finished, first_of_unique, joined_probe, served_attributes, spans, to_numpy
from ragcache.core.scope import UNSCOPED, Scope
from ragcache.core.stats import CacheStats, LatencyHistogram, RequestAccounts, ScopeStats
from ragcache.core.tier import Tier
from ragcache.core.tokens import TokenCounter
from ragcache.errors import ConfigError, InvalidInputError

__all__ = ["ComputeConfig", "EmbeddingCache", "EmbedResult", "Encoder", "Probe"]

log = logging.getLogger(__name__)

COMPUTE = "compute"
_COMPUTE_DEFAULTS = ComputeConfig()  # a frozen value: one default shared by every cache


class EmbeddingCache:
    """One embedding space, its levels (ordered, fastest first) and its model.

    ``levels``: built by the table of levels (``ragcache.build``: names, lingers, admission, reach), or plain
    tiers, taken with ``Levels``' defaults (each tier's own name, written behind). The cache's clock, stats window
    and tracer are the levels'. ``compute``: how misses are batched for the model.

    The first level is written synchronously (a caller sees its own writes at once); the others are written
    behind, by a worker thread per level, unless the levels say ``write_behind=False``. A level that raises
    ``TierUnavailableError`` is a miss for that call, counted and logged once per outage, and skipped until its
    back-off passes.

    ``generation``: the model's current generation (``ragcache.models.drift``), shared by every view (``scoped``);
    the space in use is the encoder's at that generation, and each request takes it once, at its start.
    """

    def __init__(
        self,
        encoder: Encoder,
        levels: Levels | Sequence[Tier],
        *,
        compute: ComputeConfig = _COMPUTE_DEFAULTS,
        device: torch.device | str = "cpu",
        on_close: Callable[[], None] | None = None,
        flight: Flight | None = None,
        miss_ledger_entries: int = 100_000,
    ):
        self.encoder = encoder
        # What the model declares beyond encode(), read once here: the HTTP edge asks it on every request.
        self.capabilities = capabilities_of(encoder)
        self.generation = Generation()  # the drift check (ragcache.models.drift) moves it
        self.device = torch.device(device)
        self.dtype = getattr(torch, encoder.space.dtype)
        if not isinstance(levels, Levels):
            levels = Levels(levels, dim=encoder.space.dim, dtype=self.dtype)
        elif (levels.dim, levels.dtype) != (encoder.space.dim, self.dtype):
            raise ConfigError(f"levels of {levels.dim}-d {levels.dtype} vectors for model {encoder.space.model!r}'s "
                              f"{encoder.space.dim}-d {self.dtype}")
        self.levels = levels
        tracer = levels.tracer
        # Calls inside embed_detailed: the batcher waits for company only while one has not reached it yet.
        self._calls = CallsInProgress()
        self.resolver = MissResolver(encoder, self.levels, self._calls, flight=flight, device=self.device,
                                     dtype=self.dtype, compute=compute, tracer=tracer)
        self.level_names = self.levels.names + (COMPUTE,)
        self._clock = levels.clock
        # Every request counted, overall and per scope, and each missed key's cause (shared by the views).
        self._accounts = RequestAccounts(window_s=levels.window_s)
        self._ledger = MissLedger(miss_ledger_entries)
        # Per scope (a tenant's keys, a named prompt; the model's own: UNSCOPED): its space at each generation,
        # shared by every view (``scoped``).
        self._scope = UNSCOPED  # this view's (``scoped``)
        self._spaces: dict[tuple[Scope, int], EmbeddingSpace] = {}
        # Texts' keys remembered across requests (shared by the views): a repeated text is not hashed again.
        self._key_memo = KeyMemo()
        self._is_view = False
        self._on_close = on_close
        self._closed = False
        self._tracer = tracer  # None: no spans, no tracing work (ragcache.observe.tracing)

    @property
    def tiers(self) -> list[Tier]:
        """The levels' tiers, fastest first."""
        return self.levels.tiers

    @property
    def space(self) -> EmbeddingSpace:
        """This view's space (``scoped``; the model's own unless scoped) at the model's current generation."""
        return self.space_in(self._scope)

    @property
    def scope(self) -> Scope:
        """The scope this view's requests carry when they name none."""
        return self._scope

    @property
    def tokenizer(self) -> TokenCounter:
        """The model's token counting (and, for a local model, a ``Tokenizer``): what the service needs to
        check lengths, count ``usage`` and serve /tokenize, without reaching past the cache into its model."""
        if not isinstance(self.encoder, TokenCounter):
            raise ConfigError(f"model {self.space.model!r} cannot count tokens here")
        return self.encoder

    # ---- the read path -------------------------------------------------------------------------------

    def scoped(self, scope: Scope) -> EmbeddingCache:
        """This cache as ``scope`` sees it, for code that takes a cache (the knowledge base, a route): the same
        levels, model, batcher and counters, its requests carrying ``scope``, its ``space`` the scope's. No
        thread or level of its own: closing it closes nothing."""
        view = copy.copy(self)  # every part shared but the scope (the spaces' memo included)
        view._scope, view._is_view = scope, True
        return view

    def space_in(self, scope: Scope) -> EmbeddingSpace:
        """The space (and so the keys) of ``scope`` at the model's current generation (a new one after a drift
        switch, ``ragcache.models.drift``)."""
        generation = self.generation.value
        found = self._spaces.get((scope, generation))
        if found is None:
            # A handful of tenants (from the key file) and prompts (the model's) times the generations seen. Two
            # threads may both build one: they build the same value.
            model_space = dataclasses.replace(self.encoder.space, generation=generation)
            found = self._spaces[(scope, generation)] = scope.space_of(model_space)
        return found

    def model_inputs(self, texts: Sequence[str], scope: Scope | None = None) -> list[str]:
        """``texts`` as the model is sent them on a miss under ``scope`` (None: this view's): prepared, and a named
        prompt put before each where the model does not take it apart. A pass-through caller's key
        (``RemoteEncoder.caller_key``) is registered under these, so it pays for its own prompted misses."""
        scope = self._scope if scope is None else scope
        return self.resolver.model_inputs(self.space_in(scope).prepare(texts), scope.prompt_text)

    def embed(self, texts: Sequence[str], *, normalize: bool = False, as_tensor: bool = False,
              scope: Scope | None = None) -> np.ndarray | torch.Tensor:
        """One vector per text, in input order (duplicates included), as numpy (or a torch tensor)."""
        return self.embed_detailed(texts, normalize=normalize, as_tensor=as_tensor, scope=scope).vectors

    def probe(self, texts: Sequence[str], *, normalize: bool = False, scope: Scope | None = None) -> EmbedResult | Probe:
        """The result when the first level (L1) holds every text; else, with nothing recorded, where the probe
        stopped, for ``embed_detailed(..., probe=)`` to continue from.

        Never blocks on I/O or the model, so an event loop may call it directly and hand only the
        remaining requests to a worker thread.
        """
        if self._tracer is None:
            return self._probe(texts, normalize=normalize, scope=scope)
        started_ns = time.time_ns()
        result = self._probe(texts, normalize=normalize, scope=scope)
        # A span only when L1 answered: a probe that finds a text missing leaves it to embed_detailed's span.
        if isinstance(result, EmbedResult):
            attributes = {"ragcache.num_texts": len(texts), "ragcache.resident": True, **served_attributes(result)}
            self._tracer.start_span("ragcache.embed", attributes=attributes, start_time=started_ns).end()
        return result

    def _probe(self, texts: Sequence[str], *, normalize: bool, scope: Scope | None) -> EmbedResult | Probe:
        started = self._clock()
        scope = self._scope if scope is None else scope
        space, prepared, keys = self._keyed(texts, scope)
        hits = self.levels.first.get_many(keys)
        if len(hits.index) != len(keys):
            return Probe(space, prepared, keys, hits, started, scope)
        latency_s = self._clock() - started
        self.levels.record(0, hits=len(keys), misses=0, latency_s=latency_s, traced=False)
        self._accounts.record(scope, hits=len(keys), misses=0, latency_s=latency_s)
        vectors = hits.vectors
        if normalize:
            vectors = torch.nn.functional.normalize(vectors.float(), dim=-1).to(self.dtype)
        return EmbedResult(to_numpy(vectors), np.zeros(len(keys), dtype=np.int8), self.level_names)

    def _keyed(self, texts: Sequence[str], scope: Scope) -> tuple[EmbeddingSpace, list[str], KeyList]:
        """A request's space, its texts prepared and their keys. The space is taken once: every key a request reads
        or writes is of one generation, so vectors computed while a drift switch happens are written under the
        generation they were computed for."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidInputError("texts must be a list of strings", field="inputs")
        space = self.space_in(scope)
        prepared = space.prepare(texts)
        return space, prepared, self._key_memo.keys(space, prepared)

    def embed_detailed(self, texts: Sequence[str], *, normalize: bool = False, as_tensor: bool = False,
                       scope: Scope | None = None, probe: Probe | None = None) -> EmbedResult:
        """Like ``embed``, plus the level that served each input. ``probe``: this request's resident probe
        (``probe``, for the same texts and scope), continued from where it stopped. ``scope``: the request's
        (None: this view's, ``scoped``)."""
        return self._walk(texts, {}, normalize=normalize, as_tensor=as_tensor, scope=scope, probe=probe)

    def _walk(self, texts: Sequence[str], span_attributes: dict[str, str | int], **options) -> EmbedResult:
        """``_embed_detailed(texts, **options)`` as one call in progress, in a ``ragcache.embed`` span when tracing."""
        with self._calls:
            if self._tracer is None:
                return self._embed_detailed(texts, **options)
            attributes: dict[str, str | int] = {"ragcache.num_texts": len(texts), "ragcache.model": self.space.model,
                                                **span_attributes}
            with self._tracer.start_as_current_span("ragcache.embed", attributes=attributes) as current:
                result = self._embed_detailed(texts, **options)
                current.set_attributes(served_attributes(result))
                return result

    def embed_requests(self, requests: Sequence[Sequence[str]], *, normalize: bool = False, scope: Scope | None = None,
                       probes: Sequence[Probe] | None = None,
                       on_held: Callable[[int, EmbedResult], None] | None = None) -> list[EmbedResult]:
        """Several requests' texts walked as one: one key lookup per level, one wait for the model, one write per
        level, each request answered (``EmbedResult`` in order) and counted (``stats``) as its own: the walk's fixed
        costs (a round trip per level, the hand-offs between threads) are paid once. A text two of them carry is
        looked up once and counted in each, as two concurrent requests are. ``probes``: each request's ``probe``, in
        order; their L1 answers are the walk's first step (L1 is not asked again). ``on_held(index, result)``: called
        in this thread, after the levels were asked and before the model is, for each request whose every text a
        level held, so that its caller need not wait for the others' misses."""
        scope = self._scope if scope is None else scope
        started, computed = self._clock(), len(self.level_names) - 1
        held: set[int] = set()

        def answer_held(vectors: torch.Tensor, levels: np.ndarray) -> None:
            assert on_held is not None
            for index, (start, end) in enumerate(spans(requests)):
                if not (levels[start:end] == computed).any():
                    held.add(index)
                    self._accounts.record(scope, hits=end - start, misses=0, latency_s=self._clock() - started)
                    on_held(index, finished(vectors[start:end], levels[start:end].copy(), self.level_names,
                                            normalize=normalize, dtype=self.dtype))

        texts = [text for request in requests for text in request]
        result = self._walk(texts, {"ragcache.num_requests": len(requests)}, normalize=normalize, as_tensor=False, scope=scope,
                            probe=joined_probe(probes, scope) if probes else None, record=False,
                            on_found=answer_held if on_held is not None else None)
        latency_s = self._clock() - started
        results = []
        for index, (request, (start, end)) in enumerate(zip(requests, spans(requests))):
            part = EmbedResult(result.vectors[start:end], result.levels[start:end], result.level_names)
            if index not in held:
                # As embed_detailed counts a request: a text it carries twice is computed once, and its repeat a hit.
                num_computed = len({text for text, level in zip(request, part.levels) if level == computed})
                self._accounts.record(scope, hits=len(request) - num_computed, misses=num_computed, latency_s=latency_s)
            results.append(part)
        return results

    def _embed_detailed(self, texts: Sequence[str], *, normalize: bool, as_tensor: bool, scope: Scope | None,
                        probe: Probe | None, record: bool = True,
                        on_found: Callable[[torch.Tensor, np.ndarray], None] | None = None) -> EmbedResult:
        """The walk; ``on_found(vectors, levels)``: the inputs' so far, when one is missing, before the model is asked."""
        scope = self._scope if scope is None else scope
        if probe is not None:
            if probe.scope != scope or len(probe.keys) != len(texts):
                raise InvalidInputError("probe: not this request's (another scope or other texts)", field="inputs")
            space, prepared, keys, started = probe.space, probe.texts, probe.keys, probe.started
        else:
            space, prepared, keys = self._keyed(texts, scope)
            started = self._clock()
        # Each distinct key is looked up and computed once, however often it repeats in the request. Most
        # requests repeat nothing: one dict.fromkeys tells, and the per-key bookkeeping is skipped.
        inverse: list[int] | None = None
        unique_keys, unique_texts = keys, prepared
        if len(dict.fromkeys(keys)) != len(keys):
            key_to_unique: dict[str, int] = {}
            inverse = [key_to_unique.setdefault(key, len(key_to_unique)) for key in keys]
            first_positions: list[int] = []
            for position, unique in enumerate(inverse):
                if unique == len(first_positions):  # the first time this key comes
                    first_positions.append(position)
            unique_keys = keys.take(first_positions)
            unique_texts = [prepared[position] for position in first_positions]

        first = None
        if probe is not None:
            # L1 was asked by the probe: its answer is the walk's first step (per distinct key, as the walk asks).
            first = probe.first if inverse is None else first_of_unique(probe.first, first_positions)
            self.levels.record(0, hits=len(first.index), misses=len(unique_keys) - len(first.index),
                               latency_s=self._clock() - started)
        found = self.levels.walk(unique_keys, device=self.device, first=first)
        vectors, levels = found.vectors, found.served
        # Every key some level missed gets its cause (ragcache.core.causes), judged on what the walk saw,
        # before the resolver marks computed or published keys as served.
        self._explain_misses(scope, space, unique_texts, found)
        num_computed = 0
        if len(found.missing):
            if on_found is not None:
                if inverse is None:
                    on_found(vectors, levels)
                else:
                    on_found(vectors.index_select(0, torch.tensor(inverse, device=self.device)), levels[inverse])
            num_computed = self.resolver.resolve(vectors, levels, found.missing, unique_keys, unique_texts,
                                                 prompt=scope.prompt_text)

        # A vector another replica computed while this one waited counts as a hit: nothing was computed here.
        if record:
            self._accounts.record(scope, hits=len(keys) - num_computed, misses=num_computed, latency_s=self._clock() - started)
        if inverse is not None:
            index = torch.tensor(inverse, device=self.device)
            vectors, levels = vectors.index_select(0, index), levels[inverse]
        return finished(vectors, levels, self.level_names, normalize=normalize, dtype=self.dtype, as_tensor=as_tensor)

    def _explain_misses(self, scope: Scope, space: EmbeddingSpace, texts: list[str], found: Found) -> None:
        if not (found.served > 0).any():
            return  # every key in L1: no miss to explain
        levels = self.levels
        scope_hash = hash(scope)  # once: a Scope's own hash walks its fields
        counts = self._ledger.explain(
            [(scope_hash, text) for text in texts], space.generation, found.served, num_levels=len(levels),
            unavailable=found.unavailable, bypassed=found.bypassed, on_reuse=levels.on_reuse, ttl_s=levels.ttl_s)
        levels.record_causes(counts)

    # ---- state -----------------------------------------------------------------------------------------

    def level_states(self) -> dict[str, dict]:
        """Per level: up or down, the last error while down, outages, and the figures it keeps (``Levels.states``)."""
        return self.levels.states()

    @property
    def pending_writes(self) -> int:
        """Writes accepted for the lower levels (L2/L3) and not yet stored: the write-behind's backlog."""
        return self.levels.pending_writes

    def stats(self, *, recent: bool = False) -> CacheStats:
        """Hit rates and latencies since start, or over the recent window (``window_s``)."""
        return self._accounts.stats(self.space, self.encoder, self.levels, recent=recent)

    def namespace_stats(self, *, recent: bool = False) -> dict[str, ScopeStats]:
        """Per tenant that has embedded anything: its requests, texts and hits (they are also in ``stats``)."""
        return self._accounts.tenants(recent=recent)

    def prompt_stats(self, *, recent: bool = False) -> dict[str, ScopeStats]:
        """Per named prompt embedded under: its requests, texts and hits (they are also in ``stats``)."""
        return self._accounts.prompts(recent=recent)

    def latency_histograms(self) -> dict[str, LatencyHistogram]:
        """Per level, and for whole requests (``"request"``), every batch lookup's latency since start."""
        return {**self.levels.histograms(), "request": self._accounts.histogram()}

    def flush(self) -> None:
        """Wait until every write queued for the lower levels has been stored."""
        self.levels.flush()

    def close(self) -> None:
        """Compute what is pending, flush queued writes, and release what this cache started (a view, ``scoped``,
        started nothing: closing it closes nothing)."""
        if self._closed or self._is_view:
            return
        self._closed = True
        self.resolver.close()
        self.levels.close()
        if self._on_close is not None:
            self._on_close()

    def release_on_close(self, release: Callable[[], None]) -> None:
        """Run ``release`` too when this cache closes, after its own clean-up: how a cache comes to own the parts
        opened for it (``open_cache``'s deployment)."""
        before = self._on_close

        def release_both() -> None:
            if before is not None:
                before()
            release()

        self._on_close = release_both

    def __enter__(self) -> EmbeddingCache:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
