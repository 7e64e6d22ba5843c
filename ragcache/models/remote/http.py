"""The part every remote encoder shares: batching to the upstream's limits, a concurrency cap, retries with
back-off, a circuit breaker, a bounded and validated answer, and the counters.

A subclass says only how its wire format looks: ``path``, ``request_body(texts)`` and
``parse(answer, num_texts)``, and whether its upstream reads token ids (``reads_token_ids``: ``request_body`` is then
given each id list of a batch under ``ragcache.core.scope.TOKEN_IDS`` as a list of ints). Everything an upstream
sends back is checked before the cache sees it (count, dimension, finite values, order): a vector that reaches the
cache is one the upstream really computed for that text, and nothing else is ever cached.

How one ``encode`` call goes:

1. texts are split into requests of at most ``max_inputs`` texts and ``max_tokens`` tokens (``tokens.py``);
2. the requests go out in parallel, at most ``concurrency`` at a time to this upstream (all callers);
3. each request goes through the one outbound helper (``ragcache.outbound.Upstream``): tried, and on 429,
   5xx, a refused or dropped connection tried again after an exponential back-off with jitter (or the
   upstream's ``Retry-After``), all within ``timeout_s``, its answer capped in bytes, keys masked;
4. a request that fails for good opens the breaker (``TierHealth``, the levels' breaker): calls fail at
   once, except one probe per back-off, until a probe succeeds. A refusal of a caller's own key
   (pass-through: 4xx, 429 included) fails that caller only, is not retried and leaves the breaker closed;
   any other failure met with a caller's key opens that key's own breaker, never the model's;
5. a failure fails only the texts of that request (``PartialEncodeError`` keeps the others' vectors); a request the
   upstream refused for something in its texts (400, 413, 422) is isolated here: each of its texts is sent again
   alone, once, and only the refused ones fail (marked isolated, so the batcher does not send them again).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import orjson
import torch

from ragcache.core.encoder import Capabilities
from ragcache.core.health import TierHealth
from ragcache.core.scope import token_ids_of
from ragcache.errors import InvalidInputError, PartialEncodeError, UpstreamBadResponseError, UpstreamError
from ragcache.models.local import TORCH_DTYPES
from ragcache.models.remote.config import RemoteModel, endpoint_identity, remote_space
from ragcache.models.remote.credentials import ApiKey
from ragcache.models.remote.stats import UpstreamRecorder, UpstreamStats
from ragcache.models.remote.tokens import TokenCounter
from ragcache.outbound import CallLimits, Upstream

__all__ = ["RemoteEncoder", "decode_matrix", "plan_requests"]

# An answer's bound: JSON spends at most ~25 bytes on a float ("-0.012345678901234567, "), base64 ~5.4.
BYTES_PER_VALUE = 32
ANSWER_SLACK_BYTES = 1 << 20
MAX_ERROR_EXCERPT = 200


def plan_requests(token_counts: Sequence[int], max_inputs: int, max_tokens: int) -> list[range]:
    """Consecutive runs of texts, each at most ``max_inputs`` texts and ``max_tokens`` tokens (a text over
    ``max_tokens`` on its own goes alone: the upstream truncates or refuses it)."""
    runs: list[range] = []
    start, tokens = 0, 0
    for index, count in enumerate(token_counts):
        if index > start and (index - start >= max_inputs or tokens + count > max_tokens):
            runs.append(range(start, index))
            start, tokens = index, 0
        tokens += count
    if start < len(token_counts):
        runs.append(range(start, len(token_counts)))
    return runs


class RemoteEncoder:
    """An ``Encoder`` whose model is behind HTTP. Subclasses define the wire format."""

    path: str = ""  # appended to base_url
    reads_token_ids = False  # the upstream's protocol takes token ids in place of texts

    def __init__(
        self,
        model: RemoteModel,
        *,
        api_key: ApiKey | None = None,
        transport: httpx.BaseTransport | None = None,
        health: TierHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ):
        self.model = model
        self.name = model.name
        self.space = remote_space(model)
        self.device = torch.device("cpu")
        # The cache's batcher hands over up to this many texts at once: enough for every slot to be busy. A remote
        # model takes no prompt apart (the prompt is put before each text) and names none of its own.
        # Token ids go upstream as they are, where its protocol reads them and no configured prompt must go before
        # them (a prompt is text: it cannot be put before ids without this model's tokenizer).
        self.capabilities = Capabilities(max_batch=model.max_inputs * model.concurrency, counts_tokens=True,
                                         passes_caller_key=model.pass_through_auth, remote=True,
                                         takes_token_ids=self.reads_token_ids and not model.prompt)
        self._api_key = api_key
        self._dtype = TORCH_DTYPES[model.dtype]
        self._url = model.base_url.rstrip("/") + self.path
        self._endpoint = endpoint_identity(model.base_url)
        self._tokens = TokenCounter(model.tokenizer, model_name=model.name)
        self._health = health or TierHealth()
        self._recorder = UpstreamRecorder()
        limits = CallLimits(timeout_s=model.timeout_s, connect_timeout_s=model.connect_timeout_s, max_retries=model.max_retries,
                            retry_backoff_s=model.retry_backoff_s, concurrency=model.concurrency)
        self._upstream = Upstream(model.name, limits, api_key=api_key, health=self._health, observer=self._recorder,
                                  transport=transport, clock=clock, sleep=sleep, jitter=jitter)
        self._pool = ThreadPoolExecutor(max_workers=model.concurrency, thread_name_prefix=f"ragcache-upstream-{model.name}")
        # Pass-through: text -> the keys of the callers waiting for it (caller_key), latest last.
        self._caller_keys: dict[str, list[ApiKey]] = {}
        self._caller_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, endpoint={self._endpoint!r}, model={self.model.upstream_model!r})"

    # ---- what a subclass defines ------------------------------------------------------------------------

    def request_body(self, texts: list[Any]) -> dict[str, Any]:
        """The body for ``texts``: strings, or (``reads_token_ids``) each a list of token ids."""
        raise NotImplementedError

    def parse(self, answer: Any, num_texts: int) -> tuple[np.ndarray, int | None]:
        """(vectors [num_texts, any dim], tokens the upstream reports or None) from the decoded JSON answer;
        raise ``ValueError`` saying what is wrong with it."""
        raise NotImplementedError

    # ---- the Encoder protocol ---------------------------------------------------------------------------

    def encode(self, texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:
        """Vectors for ``texts`` (already ``prepare``d by the space), in the space's dtype, on the CPU; misses
        of callers inside ``caller_key`` go with their keys. A provider takes no prompt apart: ``prompt`` is put
        before each text (the cache does so itself, since ``takes_prompt`` is not declared)."""
        texts = list(texts) if prompt is None else [prompt + text for text in texts]
        return self._encode(texts, self._by_key(texts))

    def encode_with_own_key(self, texts: Sequence[str]) -> torch.Tensor:
        """``encode`` with the model's own key only, whoever is waiting for the same texts: what the drift
        check sends its canaries with, so that no caller's key (routed, refused, rate-limited) moves it."""
        texts = list(texts)
        return self._encode(texts, [(list(range(len(texts))), None)])

    def _encode(self, texts: list[str], by_key: list[tuple[list[int], ApiKey | None]]) -> torch.Tensor:
        if not texts:
            return torch.empty((0, self.space.dim), dtype=self._dtype)
        ids = [token_ids_of(text) for text in texts] if self.capabilities.takes_token_ids else []
        sent: list[Any]
        id_rows = [row for row in ids if row is not None]
        if id_rows and len(id_rows) == len(texts):  # a batch is under one prompt (the batcher's): all token ids, or none
            sent, counts = id_rows, [len(row) for row in id_rows]
        else:
            sent = [self.model.prompt + text for text in texts] if self.model.prompt else texts
            counts = self._tokens.count(sent)
        requests = [
            (positions[run.start : run.stop], caller_key)
            for positions, caller_key in by_key
            for run in plan_requests([counts[i] for i in positions], self.model.max_inputs, self.model.max_tokens)
        ]
        outcomes = self._send(requests, sent, counts)
        refused = [index for index, ((chosen, _), outcome) in enumerate(zip(requests, outcomes))
                   if len(chosen) > 1 and isinstance(outcome, UpstreamError) and outcome.per_text]
        if refused:
            # The upstream refused something in a request's texts (400, 413, 422) without saying which: each of its
            # texts goes again alone, once. Halving the request instead (the batcher's isolation) sent its texts
            # about twice more (its halves, their halves, ...), and a group's members walked alone after that sent
            # the refused one once more: 1.66x a group's texts for one refused text.
            alone = [([position], requests[index][1]) for index in refused for position in requests[index][0]]
            kept = [index for index in range(len(requests)) if index not in set(refused)]
            requests = [requests[index] for index in kept] + alone
            outcomes = [outcomes[index] for index in kept] + self._send(alone, sent, counts)
        for (chosen, _), outcome in zip(requests, outcomes):
            if len(chosen) == 1 and isinstance(outcome, UpstreamError) and outcome.per_text:
                # Refused alone: the text's own refusal, isolated already; the batcher must not send it again.
                outcome.per_text = False
        failed = [outcome for outcome in outcomes if isinstance(outcome, UpstreamError)]
        if len(failed) == len(outcomes):
            raise failed[0]
        if len(requests) == 1:  # the common case: the decoded answer is the result, no rows split and stacked again
            return torch.from_numpy(outcomes[0]).to(self._dtype)
        per_text: list = [None] * len(texts)
        for (chosen, _), outcome in zip(requests, outcomes):
            rows = [outcome] * len(chosen) if isinstance(outcome, UpstreamError) else list(torch.from_numpy(outcome).to(self._dtype))
            for position, row in zip(chosen, rows):
                per_text[position] = row
        if failed:
            raise PartialEncodeError(per_text)
        return torch.stack(per_text)

    def _send(self, requests: list[tuple[list[int], ApiKey | None]], sent: list[Any],
              counts: list[int]) -> list[np.ndarray | UpstreamError]:
        """Each request's vectors or error, the requests in parallel (at most ``concurrency`` in flight)."""

        def call(chosen: list[int], caller_key: ApiKey | None) -> np.ndarray | UpstreamError:
            return self._call_catching([sent[i] for i in chosen], sum(counts[i] for i in chosen), caller_key)

        if len(requests) == 1:
            return [call(*requests[0])]
        return [future.result() for future in [self._pool.submit(call, *request) for request in requests]]

    def _by_key(self, texts: list[str]) -> list[tuple[list[int], ApiKey | None]]:
        """Positions of ``texts`` per caller key they go upstream with (pass-through; None: the model's own
        key). Texts of different callers never share a request, so no caller pays for another's texts."""
        if not self._caller_keys:
            return [(list(range(len(texts))), None)]
        groups: dict[int, tuple[list[int], ApiKey | None]] = {}
        with self._caller_lock:
            for position, text in enumerate(texts):
                owners = self._caller_keys.get(text)
                caller_key = owners[-1] if owners else None
                groups.setdefault(id(caller_key), ([], caller_key))[0].append(position)
        return list(groups.values())

    @contextmanager
    def caller_key(self, texts: Sequence[str], api_key: ApiKey | None) -> Iterator[None]:
        """While inside, misses among ``texts`` go upstream with the caller's ``api_key`` instead of the
        model's (``pass_through_auth``; a no-op when off or without a key). ``texts`` as ``encode`` is given them
        (``EmbeddingCache.model_inputs``: prepared, a named prompt before each). When two callers miss one text at
        once it is computed once, with the later caller's key."""
        if api_key is None or not self.model.pass_through_auth:
            yield
            return
        unique = list(dict.fromkeys(texts))
        with self._caller_lock:
            for text in unique:
                self._caller_keys.setdefault(text, []).append(api_key)
        try:
            yield
        finally:
            with self._caller_lock:
                for text in unique:
                    owners = self._caller_keys[text]
                    owners.remove(api_key)
                    if not owners:
                        del self._caller_keys[text]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as sent (prompt included): the model's tokenizer's count, or the estimate."""
        prompt = self.model.prompt or ""
        return self._tokens.count([prompt + text for text in texts])

    def check_lengths(self, texts: Sequence[str], field: str = "inputs") -> None:
        """Raise ``InvalidInputError`` naming the first text over the model's ``max_input_tokens``."""
        for index, count in enumerate(self.count_tokens(texts)):
            if count > self.space.max_seq_length:
                raise InvalidInputError(
                    f"item {index} has {count} tokens ({self._tokens.method}), over the limit of model {self.name!r} "
                    f"of {self.space.max_seq_length}; shorten it or send truncate=true",
                    field=f"{field}[{index}]",
                )

    @property
    def health(self) -> TierHealth:
        """The model's breaker; each caller key's own breaker (pass-through) is made from its back-off and clock."""
        return self._health

    def stats(self) -> UpstreamStats:
        return self._recorder.snapshot(
            provider=self.model.provider,
            endpoint=self._endpoint,
            token_counting=self._tokens.method,
            price_per_million_tokens=self.model.price_per_million_tokens,
            up=not self._health.is_down,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._upstream.close()

    # ---- one upstream request ----------------------------------------------------------------------------

    def _call_catching(self, texts: list[Any], num_tokens: int, caller_key: ApiKey | None) -> np.ndarray | UpstreamError:
        try:
            return self._call(texts, num_tokens, caller_key)
        except UpstreamError as exc:
            return exc

    def _call(self, texts: list[Any], num_tokens: int, caller_key: ApiKey | None) -> np.ndarray:
        """One upstream request through the outbound helper (deadline, byte cap, retries, breaker, masking)."""
        limit = len(texts) * self.space.dim * BYTES_PER_VALUE + ANSWER_SLACK_BYTES
        vectors, reported_tokens = self._upstream.post(
            self._url, self.request_body(texts), parse=lambda body: self._checked(body, len(texts)), max_bytes=limit,
            caller_key=caller_key,
        )
        self._recorder.answered(len(texts), reported_tokens if reported_tokens is not None else num_tokens)
        return vectors

    def _checked(self, body: bytes, num_texts: int) -> tuple[np.ndarray, int | None]:
        """The answer's vectors as float32 [num_texts, dim], or ``UpstreamBadResponseError`` saying why not."""
        try:
            vectors, reported_tokens = self.parse(orjson.loads(body), num_texts)
        except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise UpstreamBadResponseError(self.name, f"the upstream's answer is not usable: {_short(exc)}") from None
        if vectors.shape != (num_texts, self.space.dim):
            if vectors.ndim == 2 and vectors.shape[0] == num_texts:
                wrong = f"the upstream returned {vectors.shape[1]} dimensions, configured {self.space.dim}"
                raise UpstreamBadResponseError(self.name, wrong)
            raise UpstreamBadResponseError(self.name, f"the upstream returned {len(vectors)} vectors for {num_texts} texts")
        if not np.isfinite(vectors).all():
            raise UpstreamBadResponseError(self.name, "the upstream returned NaN or infinite values")
        if not (isinstance(reported_tokens, int) and reported_tokens >= 0):
            reported_tokens = None
        return vectors, reported_tokens


def decode_matrix(rows: list, num_texts: int) -> np.ndarray:
    """Rows of JSON numbers as float32 [n, dim]; ValueError unless every row is a list of numbers of one
    length. float32 of the parsed double is exact for numbers an upstream printed from float32."""
    if not isinstance(rows, list):
        raise ValueError(f"expected a list of vectors, got {type(rows).__name__}")
    if len(rows) != num_texts:
        raise ValueError(f"{len(rows)} vectors for {num_texts} texts")
    if not rows:
        return np.empty((0, 0), dtype=np.float32)
    lengths = {len(row) if isinstance(row, list) else -1 for row in rows}
    if len(lengths) != 1 or -1 in lengths:
        raise ValueError("the vectors are not lists of one length")
    try:
        matrix = np.array(rows, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("a vector holds something other than numbers") from None
    if matrix.ndim != 2:
        raise ValueError("the vectors are not flat lists of numbers")
    with np.errstate(over="ignore"):
        return matrix.astype(np.float32)  # a double beyond float32's range becomes inf, then refused


def _short(exc: Exception) -> str:
    text = str(exc)
    return (text[:MAX_ERROR_EXCERPT] + "...") if len(text) > MAX_ERROR_EXCERPT else text
