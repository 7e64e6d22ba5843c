"""``bench kv``'s measurement: blocks of each configuration run in alternation, gathered into one row per
(configuration, concurrency)."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import httpx

from ragcache.engines import VLLMClient
from ragcache.prefixes import Target
from ragcache_bench.kv_keep_warm import KeepWarm
from ragcache_bench.kv_workload import (
    CACHING,
    CHURN,
    UNREGISTERED,
    KVConfig,
    RequestResult,
    questions,
    run_requests,
    user_lanes,
)

__all__ = ["LevelResult", "Runner"]


@dataclass
class _Block:
    """What the blocks of one configuration at one level gathered."""

    results: list[RequestResult] = field(default_factory=list)
    num_errors: int = 0
    wall_s: float = 0.0
    hit_tokens: float | None = 0.0


@dataclass(frozen=True)
class LevelResult:
    """One row of the table: a configuration at one concurrency, over all its blocks."""

    configuration: str
    concurrency: int
    num_requests: int
    num_errors: int
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    tokens_per_s: float
    prompt_tokens_per_request: float
    cached_tokens_per_request: float
    # vllm:prefix_cache_hits_total over the blocks (tokens; churn and warms included); None without /metrics.
    vllm_hit_tokens: float | None
    seconds: float


def _hit_tokens(vllm: VLLMClient, base_url: str) -> float | None:
    try:
        return vllm.prefix_cache_counters(base_url).hits
    except Exception:  # noqa: BLE001 - /metrics is an extra column; a server without it still gets measured
        return None


class Runner:
    """Runs blocks of each configuration against one target and gathers them per (configuration, level)."""

    def __init__(self, target: Target, system: str, config: KVConfig, http: httpx.Client,
                 keep_warms: dict[str, KeepWarm], unregistered: str | None = None) -> None:
        self.target, self.system, self.config, self.http = target, system, config, http
        # The prefix of the same size that no registry knows, which users alternate with ``system`` under churn
        # (config.alternate); its requests are gathered as "<configuration> (unregistered)".
        self.unregistered = unregistered
        self.vllm = VLLMClient(http)
        # The keep-warm configuration each registry process serves ("on+churn+keep-warm" and any variants).
        self.keep_warms = keep_warms
        self.order = [*CACHING, *CHURN, *(name for name in keep_warms if name not in CHURN)]
        self.blocks: dict[tuple[str, int], _Block] = {}

    def keep_warm(self, configuration: str) -> None:
        """Let the registry of ``configuration`` keep the prefix warm and the others not."""
        for name, keep_warm in self.keep_warms.items():
            keep_warm.set(configuration == name)

    def block(self, configuration: str, concurrency: int, block_index: int) -> None:
        """One block of ``configuration`` at ``concurrency``: set it up (untimed), then the timed requests."""
        config = self.config
        churn = configuration.startswith("on+churn")
        if configuration == "on":
            self._prime()
        if churn:
            self.keep_warm(configuration)
            time.sleep(config.settle_s)
        prompts = [self.system + q for q in questions(config, config.block_requests(concurrency), concurrency,
                                                        block_index)]
        lanes = None
        if churn and config.alternate and self.unregistered is not None:
            # Its own questions (a block index no other block uses), so no request shares a block with another.
            others = [self.unregistered + q for q in questions(config, len(prompts), concurrency, 1000 + block_index)]
            lanes = user_lanes(prompts, others, concurrency)
        before = _hit_tokens(self.vllm, self.target.base_url)
        results, num_errors, wall_s = asyncio.run(run_requests(
            self.target, prompts, concurrency, max_tokens=config.max_tokens,
            think_s=config.churn_think_s if churn else config.think_s, salted=configuration == "off", lanes=lanes))
        after = _hit_tokens(self.vllm, self.target.base_url)
        if lanes is not None:
            control = self.blocks.setdefault((f"{configuration} ({UNREGISTERED})", concurrency), _Block())
            control.results += [r for r in results if r.tag == UNREGISTERED]
            control.wall_s += wall_s
            control.hit_tokens = None  # /metrics counts the block as a whole: its hits are on the registered row
            results = [r for r in results if r.tag != UNREGISTERED]
        gathered = self.blocks.setdefault((configuration, concurrency), _Block())
        gathered.results += results
        gathered.num_errors += num_errors
        gathered.wall_s += wall_s
        if before is None or after is None or gathered.hit_tokens is None:
            gathered.hit_tokens = None
        else:
            gathered.hit_tokens += after - before

    def _prime(self) -> None:
        self.http.post(f"{self.target.base_url}/v1/completions",
                       json={"model": self.target.model, "prompt": self.system + "Warm-up.\n",
                             "max_tokens": 1}).raise_for_status()

    def phase(self, configurations: tuple[str, ...], *, quiet: bool) -> None:
        """Every level: ``rounds`` rounds of one block per configuration, the order rotating by round."""
        from ragcache.observe.progress import progress_bar

        total = len(self.config.concurrency) * self.config.rounds * len(configurations)
        with progress_bar(desc="kv " + " / ".join(configurations), unit="block", total=total, quiet=quiet) as bar:
            for concurrency in self.config.concurrency:
                for round_index in range(self.config.rounds):
                    shift = round_index % len(configurations)
                    for configuration in configurations[shift:] + configurations[:shift]:
                        self.block(configuration, concurrency, round_index)
                        bar.update(1)

    def rows(self) -> list[LevelResult]:
        def key(item: tuple[tuple[str, int], _Block]) -> tuple[int, bool, int]:
            (configuration, concurrency), _ = item
            base = configuration.removesuffix(f" ({UNREGISTERED})")
            return self.order.index(base), base != configuration, concurrency

        return [_level_result(configuration, concurrency, block)
                for (configuration, concurrency), block in sorted(self.blocks.items(), key=key)]


def _level_result(configuration: str, concurrency: int, block: _Block) -> LevelResult:
    results = block.results
    ttft = sorted(r.ttft_s for r in results)

    def mean(values: list[int]) -> float:
        return round(statistics.fmean(values), 1) if values else 0.0

    return LevelResult(
        configuration=configuration, concurrency=concurrency, num_requests=len(results), num_errors=block.num_errors,
        ttft_p50_ms=round(1000 * _quantile(ttft, 0.5), 1) if ttft else None,
        ttft_p90_ms=round(1000 * _quantile(ttft, 0.9), 1) if ttft else None,
        tokens_per_s=round(sum(r.num_completion_tokens for r in results) / block.wall_s, 1) if block.wall_s else 0.0,
        prompt_tokens_per_request=mean([r.num_prompt_tokens for r in results]),
        cached_tokens_per_request=mean([r.num_cached_tokens for r in results]),
        vllm_hit_tokens=block.hit_tokens, seconds=round(block.wall_s, 2))


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
