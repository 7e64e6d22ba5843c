"""``bench kv``'s workload: its configuration, one streamed request and its TTFT, workers with pauses, the churn.

The protocol itself (which blocks, in what order) is in :mod:`ragcache_bench.kv`; the blocks are run by
:class:`ragcache_bench.kv_blocks.Runner`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from ragcache.prefixes import Target

__all__ = ["CACHING", "CHURN", "QUICK", "UNREGISTERED", "WORDS", "ChurnMeter", "KVConfig", "RequestResult",
           "StreamError", "churning", "questions", "run_requests", "stream_one", "user_lanes"]

# The configurations of each phase, in the order the table shows them.
CACHING = ("off", "on")
CHURN = ("on+churn", "on+churn+keep-warm")
# The tag of the unregistered prefix's requests when users alternate (KVConfig.alternate).
UNREGISTERED = "unregistered"
WORDS = ("cache", "vector", "prefix", "token", "block", "model", "query", "index", "shard", "replica", "latency",
         "memory", "batch", "stream", "server", "client", "answer", "context", "document", "search", "score")


@dataclass(frozen=True)
class KVConfig:
    """The workload: levels, alternating blocks, requests per block, completion length, pauses and churn."""

    concurrency: tuple[int, ...] = (1, 4, 8, 16)
    # Blocks of each configuration per level (alternating), and requests per block: at least
    # min_block_requests, and block_requests_per_worker per worker.
    rounds: int = 3
    min_block_requests: int = 6
    block_requests_per_worker: int = 2
    max_tokens: int = 16
    think_s: float = 0.3
    # Under churn the users come back more slowly than the churn cycles the KV cache: keep-warm's case.
    churn_think_s: float = 2.0
    churn_streams: int = 2
    churn_tokens: int = 1024
    # The churn's pace, all streams together (0: back to back, as fast as the server answers).
    churn_tokens_per_s: float = 4000.0
    settle_s: float = 2.0
    learn_s: float = 30.0
    vocab_size: int = 8192
    seed: int = 0
    # Under churn, each user alternates the registered prefix and an unregistered one of the same size (issue 42):
    # the registered prefix then sees half the traffic, and the unregistered one is the no-keep-warm control.
    alternate: bool = False

    def block_requests(self, concurrency: int) -> int:
        return max(self.min_block_requests, self.block_requests_per_worker * concurrency)


# --quick: fewer levels and rounds, shorter blocks.
QUICK: dict[str, Any] = dict(concurrency=(1, 16), rounds=2, min_block_requests=4, learn_s=20.0)


class StreamError(RuntimeError):
    """A streamed request that failed or ended without carrying a token."""


@dataclass(frozen=True)
class RequestResult:
    ttft_s: float
    latency_s: float
    num_completion_tokens: int
    num_prompt_tokens: int
    num_cached_tokens: int
    # Which prompt it was, where a block mixes two (``user_lanes``); "" otherwise.
    tag: str = ""



# ----- one streamed request -------------------------------------------------------------------------------


async def stream_one(http: httpx.AsyncClient, target: Target, prompt: str, max_tokens: int,
                     cache_salt: str | None = None) -> RequestResult:
    """Send one streamed completion; TTFT is the time until the first SSE chunk that carries a token.

    Raises :class:`StreamError` when vLLM answers an error or the stream ends without a token.
    """
    body: dict[str, Any] = {"model": target.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    start = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    async with http.stream("POST", f"{target.base_url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise StreamError(f"vLLM answered {response.status_code}: {response.text[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):  # a choice chunk is a generated token
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    if first is None:
        raise StreamError("the stream ended without a token")
    details = usage.get("prompt_tokens_details") or {}
    return RequestResult(ttft_s=first - start, latency_s=end - start,
                         num_completion_tokens=int(usage.get("completion_tokens") or 0),
                         num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
                         num_cached_tokens=int(details.get("cached_tokens") or 0))


def user_lanes(registered: list[str], unregistered: list[str], concurrency: int) -> list[list[tuple[str, str]]]:
    """What each of ``concurrency`` users sends, in order, as (tag, prompt): every user alternates the registered
    prefix's prompts (tag "") and the unregistered one's, half of the users starting on each, so at any moment
    both prefixes are in use."""
    lanes: list[list[tuple[str, str]]] = [[] for _ in range(concurrency)]
    sources = {"": iter(registered), UNREGISTERED: iter(unregistered)}
    for turn in range(-(-(len(registered) + len(unregistered)) // concurrency)):
        for user, lane in enumerate(lanes):
            tag = "" if (turn + user) % 2 == 0 else UNREGISTERED
            prompt = next(sources[tag], None)
            if prompt is not None:
                lane.append((tag, prompt))
    return lanes


async def run_requests(target: Target, prompts: list[str], concurrency: int, *, max_tokens: int, think_s: float,
                       salted: bool, lanes: list[list[tuple[str, str]]] | None = None,
                       ) -> tuple[list[RequestResult], int, float]:
    """Send ``prompts`` from ``concurrency`` workers sharing one queue, or each worker its own lane of ``lanes``
    (then ``prompts`` is ignored and each result carries its lane entry's tag), each pausing ``think_s`` after a
    request; (results, streams that failed, wall seconds)."""
    shared = [("", prompt) for prompt in reversed(prompts)]
    queues = [list(reversed(lane)) for lane in lanes] if lanes is not None else [shared] * concurrency
    total = sum(len(lane) for lane in lanes) if lanes is not None else len(prompts)
    results: list[RequestResult] = []
    errors: list[BaseException] = []

    async def worker(http: httpx.AsyncClient, pending: list[tuple[str, str]]) -> None:
        while pending:
            tag, prompt = pending.pop()
            salt = f"bench-{len(pending)}-{random.random()}" if salted else None
            try:
                result = await stream_one(http, target, prompt, max_tokens, salt)
                results.append(dataclasses.replace(result, tag=tag) if tag else result)
            except (StreamError, httpx.HTTPError, ValueError) as exc:
                errors.append(exc)
            if pending:
                await asyncio.sleep(think_s)

    limits = httpx.Limits(max_connections=len(queues) + 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(worker(http, queue) for queue in queues))
        wall_s = time.perf_counter() - start
    if errors:
        print(f"  {len(errors)} of {total} streams failed, e.g. {errors[0]}")
    return results, len(errors), wall_s


# ----- churn ------------------------------------------------------------------------------------------------


@dataclass
class ChurnMeter:
    """Churn tokens vLLM accepted, and over how long: the rate that cycles the KV cache."""

    num_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return self.num_tokens / self.seconds if self.seconds else None


@contextmanager
def churning(target: Target, config: KVConfig, meter: ChurnMeter) -> Iterator[None]:
    """While the block runs, ``churn_streams`` threads send unique random-token prompts, together
    ``churn_tokens_per_s`` (0: back to back): each takes fresh KV blocks, so the least recently used ones (an
    idle prefix) are evicted."""
    stop = threading.Event()
    lock = threading.Lock()
    period_s = config.churn_tokens * config.churn_streams / config.churn_tokens_per_s if config.churn_tokens_per_s else 0.0

    def churn(index: int) -> None:
        rng = random.Random(config.seed * 100 + index)
        next_at = time.monotonic() + period_s * index / config.churn_streams
        with httpx.Client(timeout=120) as http:
            while not stop.wait(max(0.0, next_at - time.monotonic())):
                next_at = max(next_at + period_s, time.monotonic() - period_s)  # a late send does not burst
                prompt = [rng.randrange(3, config.vocab_size) for _ in range(config.churn_tokens)]
                try:
                    http.post(f"{target.base_url}/v1/completions",
                              json={"model": target.model, "prompt": prompt, "max_tokens": 1}).raise_for_status()
                except httpx.HTTPError:
                    stop.wait(0.1)  # the server is busy or going away: churn is best effort
                    continue
                with lock:
                    meter.num_tokens += config.churn_tokens

    threads = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(config.churn_streams)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=130)
        meter.seconds += time.perf_counter() - started



def questions(config: KVConfig, num: int, level: int, block: int) -> list[str]:
    """``num`` unique short questions (fresh per block, so no block reuses another's question blocks)."""
    rng = random.Random(config.seed * 100_000 + level * 100 + block)
    return [f"Question {level}-{block}-{i}: how does the {rng.choice(WORDS)} relate to the {rng.choice(WORDS)}?\n"
            for i in range(num)]
