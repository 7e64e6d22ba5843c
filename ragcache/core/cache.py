"""The embedding cache, a facade over a walk that goes one way: a request's texts are prepared and hashed once,
its distinct keys walk the levels (``Levels.walk``: each asked only for what is still missing, hits written back
into the levels above), and what no level holds goes to the ``MissResolver`` (computed once per key, batched
across callers, once across processes with single flight). Neither calls back up into the facade.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from ragcache.core.batching import CallsInProgress
from ragcache.core.flight import Flight
from ragcache.core.keys import EmbeddingSpace, Generation, KeyList
from ragcache.core.levels import Levels
from ragcache.core.misses import MissResolver
from ragcache.core.stats import CacheStats, LatencyHistogram, LevelRecorder
from ragcache.core.tier import Tier, TierHits
from ragcache.core.tokens import TokenCounter
from ragcache.errors import ConfigError, InvalidInputError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["CacheNamespace", "EmbeddingCache", "EmbedResult", "Encoder", "NamespaceStats", "Probe"]

log = logging.getLogger(__name__)

COMPUTE = "compute"


class Encoder(Protocol):
    """What the cache needs from a model (``ModelEncoder`` is the real one)."""

    space: EmbeddingSpace

    def encode(self, texts: Sequence[str]) -> torch.Tensor: ...

    def stats(self): ...


@dataclass(frozen=True)
class EmbedResult:
    """Vectors in input order, and where each came from."""

    vectors: np.ndarray | torch.Tensor
    levels: np.ndarray  # per input: position of the level that served it; len(level_names) - 1 = computed
    level_names: tuple[str, ...]  # e.g. ("L1", "L2", "L3", "compute")

    @property
    def served(self) -> dict[str, int]:
        """How many inputs each level served (duplicates inside a request count each time)."""
        counts = np.bincount(self.levels, minlength=len(self.level_names))
        return {name: int(count) for name, count in zip(self.level_names, counts)}


@dataclass(frozen=True)
class Probe:
    """Where a resident probe (``EmbeddingCache.probe``) stopped when L1 did not hold every text: the request's
    space, prepared texts and keys (hashed once) and what L1 held. ``embed_detailed(..., probe=)`` continues
    from it instead of preparing, hashing and asking L1 again."""

    space: EmbeddingSpace
    texts: list[str]
    keys: KeyList
    first: TierHits
    started: float
    namespace: str | None


class EmbeddingCache:
    """One embedding space, its levels (ordered, fastest first) and its model.

    The first level is written synchronously (a caller sees its own writes at once); the others are written
    behind, by a worker thread per level, unless ``write_behind=False``. A level that raises ``TierUnavailableError``
    is a miss for that call, counted and logged once per outage, and skipped until its back-off passes.

    ``generation``: the model's current generation (``ragcache.models.drift``), shared by every cache of the model;
    the space in use is the encoder's at that generation, and each request takes it once, at its start.
    """

    def __init__(
        self,
        encoder: Encoder,
        tiers: Sequence[Tier],
        *,
        write_behind: bool = True,
        compute_max_batch: int = 64,
        compute_max_wait_s: float = 0.002,
        compute_max_pending: int = 4096,
        window_s: float = 300.0,
        device: torch.device | str = "cpu",
        clock: Callable[[], float] = time.perf_counter,
        on_close: Callable[[], None] | None = None,
        flight: Flight | None = None,
        generation: Generation | None = None,
        tracer: Tracer | None = None,
        write_linger_s: Mapping[int, float] | None = None,
    ):
        self.encoder = encoder
        self.generation = generation if generation is not None else Generation()
        self._space = dataclasses.replace(encoder.space, generation=self.generation.value)
        self.device = torch.device(device)
        self.dtype = getattr(torch, self.space.dtype)
        self.levels = Levels(tiers, dim=self.space.dim, dtype=self.dtype, write_behind=write_behind,
                             write_linger_s=write_linger_s, window_s=window_s, clock=clock, tracer=tracer)
        # Calls inside embed_detailed: the batcher waits for company only while one has not reached it yet.
        self._calls = CallsInProgress()
        self.resolver = MissResolver(encoder.encode, self.levels, self._calls, flight=flight, device=self.device,
                                     dtype=self.dtype, max_batch=compute_max_batch, max_wait_s=compute_max_wait_s,
                                     max_pending=compute_max_pending, tracer=tracer)
        self.level_names = self.levels.names + (COMPUTE,)
        self._clock = clock
        self._requests = LevelRecorder("cache", window_s=window_s)
        self._window_s = window_s
        # Per key namespace (a tenant's, ``namespace()``): its space at each generation, and its own counters.
        self._namespace_spaces: dict[tuple[str, int], EmbeddingSpace] = {}
        self._namespace_requests: dict[str, LevelRecorder] = {}
        self._namespaces_lock = threading.Lock()
        self._on_close = on_close
        self._closed = False
        self._tracer = tracer  # None: no spans, no tracing work (ragcache.observe.tracing)

    @property
    def tiers(self) -> list[Tier]:
        """The levels' tiers, fastest first."""
        return self.levels.tiers

    @property
    def space(self) -> EmbeddingSpace:
        """The space at the model's current generation (a new one after a drift switch, ``ragcache.models.drift``)."""
        space = self._space
        if space.generation != self.generation.value:
            # Two threads may both rebuild it after a switch: they build the same value.
            space = self._space = dataclasses.replace(space, generation=self.generation.value)
        return space

    @property
    def tokenizer(self) -> TokenCounter:
        """The model's token counting (and, for a local model, a ``Tokenizer``): what the service needs to
        check lengths, count ``usage`` and serve /tokenize, without reaching past the cache into its model."""
        if not isinstance(self.encoder, TokenCounter):
            raise ConfigError(f"model {self.space.model!r} cannot count tokens here")
        return self.encoder

    # ---- the read path -------------------------------------------------------------------------------

    def namespace(self, name: str) -> CacheNamespace:
        """A key namespace inside this cache (a tenant's): the same levels, model and threads, its own keys, so
        one namespace's entries never serve another's, and its own request counters (``namespace_stats``)."""
        return CacheNamespace(self, name)

    def space_in(self, namespace: str | None) -> EmbeddingSpace:
        """The space (and so the keys) of ``namespace`` at the model's current generation; None: the cache's."""
        space = self.space
        if namespace is None:
            return space
        found = self._namespace_spaces.get((namespace, space.generation))
        if found is None:
            # A handful of namespaces (tenants come from the key file) times the generations seen.
            found = self._namespace_spaces[(namespace, space.generation)] = dataclasses.replace(space, namespace=namespace)
        return found

    def embed(self, texts: Sequence[str], *, normalize: bool = False, as_tensor: bool = False,
              namespace: str | None = None) -> np.ndarray | torch.Tensor:
        """One vector per text, in input order (duplicates included), as numpy (or a torch tensor)."""
        return self.embed_detailed(texts, normalize=normalize, as_tensor=as_tensor, namespace=namespace).vectors

    def embed_resident(self, texts: Sequence[str], *, normalize: bool = False, namespace: str | None = None) -> EmbedResult | None:
        """The result when the first level (L1) holds every text, else None with nothing recorded."""
        outcome = self.probe(texts, normalize=normalize, namespace=namespace)
        return outcome if isinstance(outcome, EmbedResult) else None

    def probe(self, texts: Sequence[str], *, normalize: bool = False, namespace: str | None = None) -> EmbedResult | Probe:
        """The result when the first level (L1) holds every text; else, with nothing recorded, where the probe
        stopped, for ``embed_detailed(..., probe=)`` to continue from.

        Never blocks on I/O or the model, so an event loop may call it directly and hand only the
        remaining requests to a worker thread.
        """
        if self._tracer is None:
            return self._probe(texts, normalize=normalize, namespace=namespace)
        started_ns = time.time_ns()
        result = self._probe(texts, normalize=normalize, namespace=namespace)
        # A span only when L1 answered: a probe that finds a text missing leaves it to embed_detailed's span.
        if isinstance(result, EmbedResult):
            attributes = {"ragcache.num_texts": len(texts), "ragcache.resident": True, **_served_attributes(result)}
            self._tracer.start_span("ragcache.embed", attributes=attributes, start_time=started_ns).end()
        return result

    def _probe(self, texts: Sequence[str], *, normalize: bool, namespace: str | None) -> EmbedResult | Probe:
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidInputError("texts must be a list of strings", field="inputs")
        started = self._clock()
        space = self.space_in(namespace)
        prepared = space.prepare(texts)
        keys = space.keys(prepared)
        hits = self.levels.first.get_many(keys)
        if len(hits.index) != len(keys):
            return Probe(space, prepared, keys, hits, started, namespace)
        latency_s = self._clock() - started
        self.levels.record(0, hits=len(keys), misses=0, latency_s=latency_s, traced=False)
        self._record_request(namespace, hits=len(keys), misses=0, latency_s=latency_s)
        vectors = hits.vectors
        if normalize:
            vectors = torch.nn.functional.normalize(vectors.float(), dim=-1).to(self.dtype)
        return EmbedResult(_to_numpy(vectors), np.zeros(len(keys), dtype=np.int8), self.level_names)

    def embed_detailed(self, texts: Sequence[str], *, normalize: bool = False, as_tensor: bool = False,
                       namespace: str | None = None, probe: Probe | None = None) -> EmbedResult:
        """Like ``embed``, plus the level that served each input. ``probe``: this request's resident probe
        (``probe``, for the same texts and namespace), continued from where it stopped."""
        with self._calls:
            if self._tracer is None:
                return self._embed_detailed(texts, normalize=normalize, as_tensor=as_tensor, namespace=namespace, probe=probe)
            attributes: dict[str, str | int] = {"ragcache.num_texts": len(texts), "ragcache.model": self.space.model}
            with self._tracer.start_as_current_span("ragcache.embed", attributes=attributes) as current:
                result = self._embed_detailed(texts, normalize=normalize, as_tensor=as_tensor, namespace=namespace, probe=probe)
                current.set_attributes(_served_attributes(result))
                return result

    def _embed_detailed(self, texts: Sequence[str], *, normalize: bool, as_tensor: bool, namespace: str | None,
                        probe: Probe | None) -> EmbedResult:
        if probe is not None:
            if probe.namespace != namespace or len(probe.keys) != len(texts):
                raise InvalidInputError("probe: not this request's (another namespace or other texts)", field="inputs")
            space, prepared, keys, started = probe.space, probe.texts, probe.keys, probe.started
        else:
            if isinstance(texts, str) or not isinstance(texts, Sequence):
                raise InvalidInputError("texts must be a list of strings", field="inputs")
            # The space is taken once: every key this request reads or writes is of one generation, so vectors
            # computed while a drift switch happens are written under the generation they were computed for.
            space = self.space_in(namespace)
            prepared = space.prepare(texts)
            keys = space.keys(prepared)
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
            probe = None  # its L1 hits are per input, the walk's per distinct key

        first = None
        if probe is not None:
            first = probe.first  # L1 was asked on the event loop: its answer is the walk's first step
            self.levels.record(0, hits=len(first.index), misses=len(keys) - len(first.index), latency_s=self._clock() - started)
        found = self.levels.walk(unique_keys, device=self.device, first=first)
        vectors, levels = found.vectors, found.served
        num_computed = 0
        if len(found.missing):
            num_computed = self.resolver.resolve(vectors, levels, found.missing, unique_keys, unique_texts)

        # A vector another replica computed while this one waited counts as a hit: nothing was computed here.
        num_served = len(keys) - num_computed
        self._record_request(namespace, hits=num_served, misses=num_computed, latency_s=self._clock() - started)
        if inverse is not None:
            index = torch.tensor(inverse, device=self.device)
            vectors, levels = vectors.index_select(0, index), levels[inverse]
        if normalize:
            vectors = torch.nn.functional.normalize(vectors.float(), dim=-1).to(self.dtype)
        return EmbedResult(vectors if as_tensor else _to_numpy(vectors), levels, self.level_names)

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
        overall = self._requests.snapshot(recent=recent)
        encoder_stats = self.encoder.stats()
        return CacheStats(
            space_id=self.space.space_id,
            model=self.space.model,
            period="recent" if recent else "since_start",
            period_s=self._requests.window_s if recent else 0.0,
            requests=self._requests.num_calls(recent=recent),
            texts=overall.lookups,
            hits=overall.hits,
            hit_rate=overall.hit_rate,
            texts_computed=overall.misses,
            compute_s=encoder_stats.compute_s,
            compute_s_saved=overall.hits * encoder_stats.seconds_per_text,
            levels=self.levels.snapshots(recent=recent),
        )

    def _record_request(self, namespace: str | None, *, hits: int, misses: int, latency_s: float) -> None:
        self._requests.record(hits=hits, misses=misses, latency_s=latency_s)
        if namespace is None:
            return
        recorder = self._namespace_requests.get(namespace)
        if recorder is None:
            with self._namespaces_lock:
                recorder = self._namespace_requests.setdefault(namespace, LevelRecorder(namespace, window_s=self._window_s))
        recorder.record(hits=hits, misses=misses, latency_s=latency_s)

    def namespace_stats(self, *, recent: bool = False) -> dict[str, NamespaceStats]:
        """Per namespace that has embedded anything: its requests, texts and hits (they are also in ``stats``)."""
        with self._namespaces_lock:
            recorders = dict(self._namespace_requests)
        stats = {}
        for name, recorder in sorted(recorders.items()):
            figures = recorder.snapshot(recent=recent)
            stats[name] = NamespaceStats(recorder.num_calls(recent=recent), figures.lookups, figures.hits, figures.hit_rate)
        return stats

    def latency_histograms(self) -> dict[str, LatencyHistogram]:
        """Per level, and for whole requests (``"request"``), every batch lookup's latency since start."""
        return {**self.levels.histograms(), "request": self._requests.histogram()}

    def flush(self) -> None:
        """Wait until every write queued for the lower levels has been stored."""
        self.levels.flush()

    def close(self) -> None:
        """Compute what is pending, flush queued writes, and release what this cache started."""
        if self._closed:
            return
        self._closed = True
        self.resolver.close()
        self.levels.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> EmbeddingCache:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _served_attributes(result: EmbedResult) -> dict[str, int]:
    return {f"ragcache.served.{name}": count for name, count in result.served.items()}


def _to_numpy(vectors: torch.Tensor) -> np.ndarray:
    # numpy has no bfloat16: those vectors widen to float32, which is exact.
    if vectors.dtype == torch.bfloat16:
        vectors = vectors.float()
    return vectors.cpu().numpy()


@dataclass(frozen=True)
class NamespaceStats:
    """One key namespace's share of its cache's traffic."""

    requests: int
    texts: int
    hits: int
    hit_rate: float


class CacheNamespace:
    """A key namespace inside an ``EmbeddingCache`` (``EmbeddingCache.namespace``), used where a cache is: its
    embed calls go through the cache with ``namespace`` set, its ``space`` is the namespace's, and everything
    else (levels, stats, tokenizer) is the cache's own. Nothing to close: the cache is."""

    def __init__(self, cache: EmbeddingCache, name: str):
        self.cache = cache
        self.name = name

    @property
    def space(self) -> EmbeddingSpace:
        return self.cache.space_in(self.name)

    def embed(self, texts: Sequence[str], *, normalize: bool = False, as_tensor: bool = False) -> np.ndarray | torch.Tensor:
        return self.cache.embed(texts, normalize=normalize, as_tensor=as_tensor, namespace=self.name)

    def embed_detailed(self, texts: Sequence[str], *, normalize: bool = False, as_tensor: bool = False,
                       probe: Probe | None = None) -> EmbedResult:
        return self.cache.embed_detailed(texts, normalize=normalize, as_tensor=as_tensor, namespace=self.name, probe=probe)

    def embed_resident(self, texts: Sequence[str], *, normalize: bool = False) -> EmbedResult | None:
        return self.cache.embed_resident(texts, normalize=normalize, namespace=self.name)

    def probe(self, texts: Sequence[str], *, normalize: bool = False) -> EmbedResult | Probe:
        return self.cache.probe(texts, normalize=normalize, namespace=self.name)

    def close(self) -> None:
        """Nothing of its own to close (closing the cache would close it for every namespace)."""

    def __getattr__(self, name: str):
        return getattr(self.cache, name)
