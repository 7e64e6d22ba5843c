"""The few calls the registry makes to vLLM (and an LMCache controller), over one ``httpx.Client``.

Every transport or HTTP failure is converted here into :class:`TargetUnavailableError`, so the
registry handles one error type; the ``httpx.Client`` is the test seam (``httpx.MockTransport``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ragcache.errors import RagCacheError

from .model import PromptForm, Target

__all__ = ["TargetUnavailableError", "CompletionUsage", "PrefixCacheCounters", "VLLMClient"]


class TargetUnavailableError(RagCacheError):
    """vLLM (or an LMCache controller) was unreachable, timed out, or answered an error."""

    def __init__(self, url: str, message: str, status_code: int | None = None) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status_code = status_code  # the HTTP status when the server answered one


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


class VLLMClient:
    """Talks to vLLM's OpenAI-compatible server: one-token completions, /tokenize, /metrics."""

    def __init__(self, http: httpx.Client, clock: Callable[[], float] = time.perf_counter) -> None:
        self._http = http
        self._clock = clock

    def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._http.post(url, json=body)
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
            raise TargetUnavailableError(url, f"{type(exc).__name__}: {exc}", status) from exc

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
            url = f"{target.base_url}/v1/chat/completions"
            body["messages"] = [{"role": "system", "content": text}]
        else:
            url = f"{target.base_url}/v1/completions"
            body["prompt"] = text
        start = self._clock()
        data = self._post(url, body)
        latency_s = self._clock() - start
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return CompletionUsage(
            num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
            num_cached_tokens=int(details.get("cached_tokens") or 0),
            latency_s=latency_s,
        )

    def count_tokens(self, target: Target, text: str) -> int:
        """Token count of ``text`` by the target's own tokenizer, through vLLM's ``/tokenize``."""
        data = self._post(f"{target.base_url}/tokenize", {"model": target.model, "prompt": text})
        return int(data["count"])

    def tokenize(self, target: Target, text: str) -> list[int]:
        """Token ids of ``text`` (what LMCache's pin API is keyed by)."""
        data = self._post(f"{target.base_url}/tokenize", {"model": target.model, "prompt": text})
        return [int(t) for t in data["tokens"]]

    def prefix_cache_counters(self, base_url: str) -> PrefixCacheCounters:
        """Scrape ``/metrics`` for ``vllm:prefix_cache_{queries,hits}_total`` and the block size."""
        url = f"{base_url}/metrics"
        try:
            response = self._http.get(url)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise TargetUnavailableError(url, f"{type(exc).__name__}: {exc}") from exc
        return parse_prefix_cache_counters(response.text)

    def lmcache_pin(self, controller_url: str, tokens: list[int], instance_id: str, location: str) -> int:
        """Ask an LMCache controller to pin the KV chunks of ``tokens``; returns the tokens it pinned."""
        body = {"tokens": tokens, "instance_id": instance_id, "location": location}
        data = self._post(f"{controller_url.rstrip('/')}/pin", body)
        return int(data.get("num_tokens", 0))


def parse_prefix_cache_counters(text: str) -> PrefixCacheCounters:
    """Pick the prefix-cache counters out of a Prometheus exposition (summing engines and models)."""
    queries = hits = 0.0
    block_size: int | None = None
    load: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:prefix_cache_queries_total":
                queries += sample.value
            elif sample.name == "vllm:prefix_cache_hits_total":
                hits += sample.value
            elif sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                load[sample.name] = load.get(sample.name, 0.0) + sample.value
            elif sample.name == "vllm:cache_config_info" and "block_size" in sample.labels:
                try:
                    block_size = int(sample.labels["block_size"])
                except ValueError:
                    block_size = None
    return PrefixCacheCounters(queries=queries, hits=hits, block_size=block_size,
                               num_running=load.get("vllm:num_requests_running"),
                               num_waiting=load.get("vllm:num_requests_waiting"))
