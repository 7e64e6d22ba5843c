"""Benchmark: prefix hit rate with and without pinning under the same churn, and the latency of a
request whose prefix is pinned vs one whose prefix was evicted. Runs against a real vLLM.

    python -m ragcache_bench.prefixes            # starts its own vLLM (.venv-vllm, .cache/tiny-llama)
    python -m ragcache_bench.prefixes --base-url http://127.0.0.1:8000 --model my-model

Each run sends rounds of churn (unique random token prompts, enough to cycle the whole KV cache)
followed by one "user" request = prefix + a fresh question, and reads the user request's
``cached_tokens``. The pinned run has the registry's keep-warm loop running; the unpinned run
registers the same prefix with ``pinned=False``. Both runs get fresh churn of the same shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target
from ragcache.prefixes.policy import judge_residency
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

__all__ = ["ChurnConfig", "RunResult", "build_prefix_text", "run_churn", "run_scenario", "add_arguments", "run"]

_RULE = ("Rule {i}: answer only from the retrieved context, quote the passage you rely on, "
         "and say plainly when the context does not contain the answer.")


@dataclass(frozen=True)
class ChurnConfig:
    """Shape of the churn: ``num_rounds`` x (``churn_per_round`` prompts of ``churn_tokens`` tokens,
    one every ``churn_interval_s``, then one user request)."""

    num_rounds: int = 20
    churn_per_round: int = 5
    churn_tokens: int = 1024
    churn_interval_s: float = 0.15
    vocab_size: int = 8192
    seed: int = 0


@dataclass(frozen=True)
class RunResult:
    """User requests of one run: how many found the whole prefix cached, and their latencies."""

    pinned: bool
    num_requests: int
    num_hits: int
    latencies_hit_s: tuple[float, ...]
    latencies_miss_s: tuple[float, ...]
    num_warms: int
    # vLLM's own token-level hit rate over the run (its /metrics counters; includes the warms).
    vllm_hit_rate: float | None = None

    @property
    def hit_rate(self) -> float:
        return self.num_hits / self.num_requests if self.num_requests else 0.0


def build_prefix_text(http: httpx.Client, target: Target, num_tokens: int) -> str:
    """A constant system prompt of at least ``num_tokens`` tokens (counted by vLLM's /tokenize)."""
    rules: list[str] = []
    while True:
        rules.append(_RULE.format(i=len(rules) + 1))
        text = "You are a retrieval assistant.\n" + "\n".join(rules) + "\nContext:\n"
        if len(rules) % 8 == 0 and count_tokens(http, target, text) >= num_tokens:
            return text


def count_tokens(http: httpx.Client, target: Target, text: str) -> int:
    """Tokens of ``text`` by the target's tokenizer (vLLM's /tokenize, BOS included)."""
    r = http.post(f"{target.base_url}/tokenize", json={"model": target.model, "prompt": text})
    r.raise_for_status()
    return int(r.json()["count"])


def _complete(http: httpx.Client, target: Target, prompt: str | list[int]) -> dict[str, Any]:
    r = http.post(f"{target.base_url}/v1/completions",
                  json={"model": target.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0})
    r.raise_for_status()
    return r.json()


def run_churn(http: httpx.Client, target: Target, prefix_text: str, churn: ChurnConfig, *,
              block_size: int, pinned: bool, quiet: bool = True) -> RunResult:
    """Send the churn and user requests; a user request hits when every full block of it that lies
    inside the prefix came from the cache. A progress bar (stderr) counts the rounds unless ``quiet``."""
    from ragcache.progress import progress_bar

    rng = random.Random(churn.seed)
    num_prefix_tokens = count_tokens(http, target, prefix_text)
    hits, lat_hit, lat_miss = 0, [], []
    label = "pinned" if pinned else "unpinned"
    with progress_bar(desc=f"prefixes ({label})", unit="round", total=churn.num_rounds, quiet=quiet) as bar:
        for round_no in range(churn.num_rounds):
            for _ in range(churn.churn_per_round):
                # Token-id prompts: exact length, never shared with anything else, so each one takes
                # fresh KV blocks and pushes the least recently used ones out.
                _complete(http, target, [rng.randrange(3, churn.vocab_size) for _ in range(churn.churn_tokens)])
                time.sleep(churn.churn_interval_s)
            start = time.perf_counter()
            usage = _complete(http, target, f"{prefix_text}Question {round_no} ({rng.random():.12f}): why?")["usage"]
            latency = time.perf_counter() - start
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            if judge_residency(num_prefix_tokens, cached, block_size):
                hits += 1
                lat_hit.append(latency)
            else:
                lat_miss.append(latency)
            bar.update(1)
    return RunResult(pinned, churn.num_rounds, hits, tuple(lat_hit), tuple(lat_miss), num_warms=0)


def run_scenario(registry: PrefixRegistry, http: httpx.Client, target: Target, prefix_text: str,
                 churn: ChurnConfig, *, pinned: bool, block_size: int, quiet: bool = True) -> RunResult:
    """Register the prefix (pinned or not) in ``registry``, run the churn, and report."""
    name = "bench-pinned" if pinned else "bench-unpinned"
    before = registry.scrape(target.base_url)
    registry.register(PrefixSpec(name, prefix_text, target, pinned=pinned))
    result = run_churn(http, target, prefix_text, churn, block_size=block_size, pinned=pinned, quiet=quiet)
    num_warms = registry.prefix_stats(name).num_warms
    after = registry.scrape(target.base_url)
    registry.delete(name)
    vllm_hit_rate = None
    if before is not None and after is not None and after.queries > before.queries:
        vllm_hit_rate = round((after.hits - before.hits) / (after.queries - before.queries), 3)
    return dataclasses.replace(result, num_warms=num_warms, vllm_hit_rate=vllm_hit_rate)


def _ms(values: tuple[float, ...], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def summarize(pinned: RunResult, unpinned: RunResult, churn: ChurnConfig, extra: dict[str, Any]) -> dict[str, Any]:
    """The JSON report: hit rates, and latency of pinned-hit vs evicted requests (median, p90)."""
    return {
        "churn": {k: v for k, v in asdict(churn).items() if k != "seed"},
        **extra,
        "hit_rate_pinned": round(pinned.hit_rate, 3),
        "hit_rate_unpinned": round(unpinned.hit_rate, 3),
        "num_warms_pinned": pinned.num_warms,
        "vllm_token_hit_rate": {"pinned": pinned.vllm_hit_rate, "unpinned": unpinned.vllm_hit_rate},
        "latency_ms_pinned_hit": {"p50": _ms(pinned.latencies_hit_s, 0.5), "p90": _ms(pinned.latencies_hit_s, 0.9),
                                  "n": len(pinned.latencies_hit_s)},
        "latency_ms_evicted": {"p50": _ms(unpinned.latencies_miss_s, 0.5), "p90": _ms(unpinned.latencies_miss_s, 0.9),
                               "n": len(unpinned.latencies_miss_s)},
    }


def print_table(report: dict[str, Any]) -> None:
    """A small human-readable table of the report."""
    hit, ev = report["latency_ms_pinned_hit"], report["latency_ms_evicted"]
    print(f"prefix: {report['prefix_tokens']} tokens; churn: {report['churn']['num_rounds']} rounds x "
          f"{report['churn']['churn_per_round']} x {report['churn']['churn_tokens']} tokens; "
          f"KV cache {report['kv_cache_tokens']} tokens")
    print(f"{'':24}{'hit rate':>10}{'p50 ms':>10}{'p90 ms':>10}{'n':>6}")
    print(f"{'pinned (keep-warm)':24}{report['hit_rate_pinned']:>10}{hit['p50']!s:>10}{hit['p90']!s:>10}{hit['n']:>6}")
    print(f"{'unpinned (evicted)':24}{report['hit_rate_unpinned']:>10}{ev['p50']!s:>10}{ev['p90']!s:>10}{ev['n']:>6}")
    print(f"warm requests sent for the pinned prefix: {report['num_warms_pinned']}; vLLM's own token hit rate "
          f"(/metrics, churn included): {report['vllm_token_hit_rate']}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``ragcache bench prefixes``."""
    parser.add_argument("--base-url", help="use this running vLLM instead of starting one")
    parser.add_argument("--model", default="tiny-llama", help="served model name (with --base-url)")
    parser.add_argument("--vllm-python", type=Path, default=Path(".venv-vllm/bin/python"))
    parser.add_argument("--model-path", type=Path, default=Path(".cache/tiny-llama"))
    parser.add_argument("--num-blocks", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=ChurnConfig.num_rounds)
    parser.add_argument("--churn-per-round", type=int, default=ChurnConfig.churn_per_round)
    parser.add_argument("--churn-tokens", type=int, default=ChurnConfig.churn_tokens)
    parser.add_argument("--churn-interval-s", type=float, default=ChurnConfig.churn_interval_s)
    parser.add_argument("--min-rewarm-s", type=float, default=0.1)
    parser.add_argument("--max-rewarm-s", type=float, default=1.0)
    parser.add_argument("--warm-budget-per-minute", type=int, default=600)
    parser.add_argument("--json-out", type=Path, default=Path("bench-results/prefixes.json"))
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run both scenarios (unpinned first, then pinned), print the table, write JSON, return the report."""
    server = None
    if args.base_url is None:
        server = VLLMServer(VLLMServerConfig(python=args.vllm_python, model=args.model_path,
                                             block_size=args.block_size, num_blocks=args.num_blocks,
                                             log_path=Path(tempfile.gettempdir()) / "ragcache-bench-vllm.log"))
        server.start()
    base_url = args.base_url or server.base_url  # type: ignore[union-attr]
    target = Target(base_url, args.model if args.base_url else server.config.served_model_name)  # type: ignore[union-attr]
    config = PrefixRegistryConfig(
        file_path=Path(tempfile.mkdtemp()) / "prefixes.json",
        initial_rewarm_interval_s=args.min_rewarm_s * 2, min_rewarm_interval_s=args.min_rewarm_s,
        max_rewarm_interval_s=args.max_rewarm_s, warm_budget_per_minute=args.warm_budget_per_minute,
        tick_interval_s=min(0.05, args.min_rewarm_s / 2), default_block_size=args.block_size,
    )
    try:
        with httpx.Client(timeout=60) as http:
            registry = PrefixRegistry.create(config, http=http)
            registry.start()
            try:
                prefix_text = build_prefix_text(http, target, args.prefix_tokens)
                results = {}
                for seed, pinned in ((1, False), (2, True)):
                    churn = ChurnConfig(args.rounds, args.churn_per_round, args.churn_tokens,
                                        args.churn_interval_s, seed=seed)
                    results[pinned] = run_scenario(registry, http, target, prefix_text, churn,
                                                   pinned=pinned, block_size=args.block_size, quiet=args.quiet)
                num_prefix_tokens = count_tokens(http, target, prefix_text)
            finally:
                registry.close()
    finally:
        if server is not None:
            server.stop()
    report = summarize(results[True], results[False], churn, {
        "prefix_tokens": num_prefix_tokens, "kv_cache_tokens": args.num_blocks * args.block_size,
        "rewarm_interval_s": [args.min_rewarm_s, args.max_rewarm_s],
        "vllm_startup_s": round(server.startup_s, 1) if server and server.startup_s else None,
    })
    print_table(report)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description="Prefix keep-warm benchmark against a real vLLM")
    add_arguments(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
