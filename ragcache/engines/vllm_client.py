"""The few calls made to vLLM (and an LMCache controller), through the one outbound helper
(``ragcache.outbound.Upstream``: an overall deadline, a byte cap on each answer, no redirects, masking).

Every failure is converted here into :class:`TargetUnavailableError`, so the registry handles one error type;
an answer that is not what vLLM sends (malformed, missing a field, over the byte cap) is the subclass
:class:`TargetBadResponseError`, which names vLLM (a 502 where it reaches a caller). The breaker is the
registry's own, one per target (it schedules warms by its back-off), so the helper keeps none here. The
``httpx.Client`` given is the test seam (``httpx.MockTransport``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from ragcache.errors import (
    RagCacheError,
    UpstreamBadResponseError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from ragcache.outbound import CallLimits, Upstream

from .target import PromptForm, Target

__all__ = ["TargetUnavailableError", "TargetBadResponseError", "CompletionUsage", "PrefixCacheCounters", "VLLMClient"]

# The largest answer read from vLLM or LMCache: /tokenize of the longest prefix, or a /metrics exposition.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_READ_TIMEOUT_S = 5.0
# Endpoints whose connections are kept at once (each has two upstreams: reads and completions).
MAX_ENDPOINTS = 256


class TargetUnavailableError(RagCacheError):
    """vLLM (or an LMCache controller) was unreachable, timed out, or answered an error."""

    def __init__(self, url: str, message: str, status_code: int | None = None) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status_code = status_code  # the HTTP status when the server answered one


class TargetBadResponseError(TargetUnavailableError):
    """vLLM (or an LMCache controller) answered, but not with what it sends: malformed, a field missing, or
    more than ``MAX_ANSWER_BYTES``. Names vLLM; a request that needed the answer fails with 502."""


@dataclass(frozen=True)
class CompletionUsage:
    """Token usage of one request, as vLLM reports it, and its wall-clock latency."""

    num_prompt_tokens: int
    num_cached_tokens: int
    latency_s: float


@dataclass(frozen=True)
class PrefixCacheCounters:
    """vLLM's prefix-cache counters (in tokens, summed over engines), its KV block size, and its load now."""

    queries: float
    hits: float
    block_size: int | None
    # vllm:num_requests_running / vllm:num_requests_waiting (summed over engines); None when not exposed.
    num_running: float | None = None
    num_waiting: float | None = None
    # From vllm:cache_config_info: whether prefix caching is on, and the KV cache's blocks (None: not exposed).
    prefix_caching: bool | None = None
    num_gpu_blocks: int | None = None


class VLLMClient:
    """Talks to vLLM's OpenAI-compatible server: one-token completions, /tokenize, /metrics.

    Each endpoint (base URL) has its own ``Upstream``s, so its own connections and call slots: an endpoint that hangs
    (a frozen replica accepts connections and never answers) holds only its own slots, never another endpoint's. Reads
    (``/metrics``, ``/tokenize``) have a short deadline of their own (``read_timeout_s``); a completion, which may wait
    for a prefill behind the engine's users, has ``timeout_s``.
    """

    def __init__(self, http: httpx.Client | None = None, clock: Callable[[], float] = time.perf_counter, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> None:
        self._http = http
        self._limits = {kind: CallLimits(timeout_s=limit, connect_timeout_s=min(5.0, limit))
                        for kind, limit in (("warm", timeout_s), ("read", min(read_timeout_s, timeout_s)))}
        self._upstreams: OrderedDict[tuple[str, str], Upstream] = OrderedDict()
        self._lock = threading.Lock()
        self._clock = clock

    def _upstream(self, base_url: str, kind: str) -> Upstream:
        """``base_url``'s own upstream for calls of ``kind`` (the least recently used past ``MAX_ENDPOINTS`` closed)."""
        with self._lock:
            upstream = self._upstreams.get((base_url, kind))
            if upstream is None:
                upstream = self._upstreams[(base_url, kind)] = Upstream("vLLM", self._limits[kind], transport=self._http)
                if len(self._upstreams) > 2 * MAX_ENDPOINTS:
                    self._upstreams.popitem(last=False)[1].close()
            self._upstreams.move_to_end((base_url, kind))
            return upstream

    def _call(self, base_url: str, path: str, body: dict[str, Any] | None, parse: Callable[[bytes], Any], *,
              kind: str = "read") -> Any:
        """POST ``body`` (GET when None) to ``base_url + path`` through the outbound helper; its errors as this
        module's."""
        url = f"{base_url}{path}"
        upstream = self._upstream(base_url, kind)
        try:
            if body is None:
                return upstream.get(url, parse=parse, max_bytes=MAX_ANSWER_BYTES)
            return upstream.post(url, body, parse=parse, max_bytes=MAX_ANSWER_BYTES)
        except UpstreamError as exc:
            # The upstream's own words (a body excerpt, a parse error quoting its values) never travel on: the
            # message reaches a tenant's key (a warm's result, /stats) and the log, and a URL that answers with
            # another service's secret must not read it back to whoever registered the prefix (issue 27, item 2).
            if isinstance(exc, UpstreamBadResponseError) and exc.status_code is None:
                raise TargetBadResponseError(url, "vLLM answered something vLLM never sends") from exc
            raise TargetUnavailableError(url, _classified(exc), exc.status_code) from exc

    def complete_one(self, target: Target, text: str, form: PromptForm, priority: int | None = None) -> CompletionUsage:
        """Send ``text`` with ``max_tokens=1`` (at vLLM request ``priority`` when given) and report what
        vLLM found cached.

        Needs the server to run with ``--enable-prompt-tokens-details``; without it vLLM omits
        ``prompt_tokens_details`` and every warm reads as zero cached tokens.
        """
        body: dict[str, Any] = {"model": target.model, "max_tokens": 1, "temperature": 0.0}
        if priority is not None:
            body["priority"] = priority
        if form is PromptForm.CHAT:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "system", "content": text}]
        else:
            path = "/v1/completions"
            body["prompt"] = text
        url = f"{target.base_url}{path}"
        start = self._clock()
        usage = self._call(target.base_url, path, body, parse=_usage, kind="warm")
        latency_s = self._clock() - start
        details = usage.get("prompt_tokens_details") or {}
        if not isinstance(details, dict):
            raise TargetBadResponseError(url, "vLLM's usage.prompt_tokens_details is not an object")
        try:
            return CompletionUsage(
                num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
                num_cached_tokens=int(details.get("cached_tokens") or 0),
                latency_s=latency_s,
            )
        except (TypeError, ValueError):
            raise TargetBadResponseError(url, "vLLM's usage holds token counts that are not integers") from None

    def count_tokens(self, target: Target, text: str) -> int:
        """Token count of ``text`` by the target's own tokenizer, through vLLM's ``/tokenize``."""
        return self._call(target.base_url, "/tokenize", {"model": target.model, "prompt": text}, parse=_token_count)

    def tokenize(self, target: Target, text: str) -> list[int]:
        """Token ids of ``text`` as a completion prompt (BOS included, as vLLM's completions see it)."""
        return self._call(target.base_url, "/tokenize", {"model": target.model, "prompt": text}, parse=_token_ids)

    def tokenize_messages(self, target: Target, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat as vLLM's chat completions see it: the model's chat template applied (with the
        generation prompt, as a chat completion adds it) by vLLM's own ``/tokenize``."""
        body = {"model": target.model, "messages": messages, "add_generation_prompt": True}
        return self._call(target.base_url, "/tokenize", body, parse=_token_ids)

    def prefix_cache_counters(self, base_url: str) -> PrefixCacheCounters:
        """Scrape ``/metrics`` for ``vllm:prefix_cache_{queries,hits}_total`` and the block size."""
        return self._call(base_url, "/metrics", None, parse=lambda body: parse_prefix_cache_counters(body.decode("utf-8")))

    def lmcache_pin(self, controller_url: str, tokens: list[int], instance_id: str, location: str) -> int:
        """Ask an LMCache controller to pin the KV chunks of ``tokens``; returns the tokens it pinned."""
        body = {"tokens": tokens, "instance_id": instance_id, "location": location}
        return self._call(controller_url.rstrip("/"), "/pin", body, parse=_pinned_tokens, kind="warm")

    def close(self) -> None:
        with self._lock:
            upstreams, self._upstreams = list(self._upstreams.values()), OrderedDict()
        for upstream in upstreams:
            upstream.close()


def _classified(exc: UpstreamError) -> str:
    """A failure as a status and a short kind, without anything the upstream said."""
    if exc.status_code is not None:
        return f"answered HTTP {exc.status_code}"
    if isinstance(exc, UpstreamTimeoutError):
        return "timed out"
    if isinstance(exc, UpstreamUnavailableError):
        return "cannot be reached"
    return "failed"


def _json_object(body: bytes) -> dict[str, Any]:
    answer = orjson.loads(body)
    if not isinstance(answer, dict):
        raise ValueError(f"expected a JSON object, got {type(answer).__name__}")
    return answer


def _usage(body: bytes) -> dict[str, Any]:
    usage = _json_object(body).get("usage") or {}
    if not isinstance(usage, dict):
        raise ValueError("'usage' is not an object")
    return usage


def _token_count(body: bytes) -> int:
    count = _json_object(body).get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"/tokenize answered without a token count ('count': {count!r:.40})")
    return count


def _pinned_tokens(body: bytes) -> int:
    return int(_json_object(body).get("num_tokens", 0))


def _token_ids(body: bytes) -> list[int]:
    tokens = _json_object(body).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ValueError("/tokenize answered without a list of integer 'tokens'")
    return tokens


# The only series read here. vLLM's exposition is ~50 KB: parsing all of it cost ~14 ms of CPU a scrape (measured on
# the 2-core development machine), which a due warm pays before it goes out; the few lines kept cost next to nothing.
_SERIES = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:cache_config_info", "vllm:num_requests_running",
           "vllm:num_requests_waiting")


def parse_prefix_cache_counters(text: str) -> PrefixCacheCounters:
    """Pick the prefix-cache counters out of a Prometheus exposition (summing engines and models)."""
    queries = hits = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    prefix_caching: bool | None = None
    load: dict[str, float] = {}
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_SERIES))
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            if sample.name == "vllm:prefix_cache_queries_total":
                queries += sample.value
            elif sample.name == "vllm:prefix_cache_hits_total":
                hits += sample.value
            elif sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                load[sample.name] = load.get(sample.name, 0.0) + sample.value
            elif sample.name == "vllm:cache_config_info":
                block_size = _int_label(sample.labels, "block_size")
                num_gpu_blocks = _int_label(sample.labels, "num_gpu_blocks")
                caching = sample.labels.get("enable_prefix_caching")
                prefix_caching = None if caching is None else caching.lower() == "true"
    return PrefixCacheCounters(queries=queries, hits=hits, block_size=block_size,
                               num_running=load.get("vllm:num_requests_running"),
                               num_waiting=load.get("vllm:num_requests_waiting"),
                               prefix_caching=prefix_caching, num_gpu_blocks=num_gpu_blocks)


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(labels[name])
    except (KeyError, ValueError):
        return None
