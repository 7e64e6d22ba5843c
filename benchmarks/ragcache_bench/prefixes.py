"""Benchmark: prefix hit rate with and without pinning under the same churn, side by side, and the latency of
a request whose prefix is pinned vs one whose prefix was evicted. Runs against a real vLLM.

    python -m ragcache_bench.prefixes            # starts its own vLLM (.venv-vllm, .cache/tiny-llama)
    python -m ragcache_bench.prefixes --base-url http://127.0.0.1:8000 --model my-model

Two prefixes of the same length are registered at once, one pinned (the registry keeps it warm), one not.
Each round sends churn (unique random token prompts, enough to cycle the whole KV cache), then one "user"
request per prefix (prefix + a fresh question; which goes first alternates by round), and reads each user
request's ``cached_tokens``: both prefixes see the same churn, the same server and the same moment's load.
Verdicts: the pinned prefix hits in >= 90% of the rounds, and its requests' median latency is below the
evicted ones'.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from ragcache.prefixes import PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target
from ragcache.prefixes.policy import judge_residency
from ragcache_bench.report import BenchResult, command_line, format_table, machine_info, write_json
from ragcache_bench.report import Target as Goal
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

__all__ = ["ChurnConfig", "RunResult", "build_prefix_text", "count_tokens", "run_side_by_side", "add_arguments", "run",
           "verdicts"]

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
    """User requests of one prefix over the run: how many found the whole prefix cached, and their latencies."""

    pinned: bool
    num_requests: int
    num_hits: int
    latencies_hit_s: tuple[float, ...]
    latencies_miss_s: tuple[float, ...]
    num_warms: int

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


def run_side_by_side(registry: PrefixRegistry, http: httpx.Client, target: Target, texts: dict[bool, str],
                     churn: ChurnConfig, *, block_size: int, quiet: bool = True) -> tuple[dict[bool, RunResult], float | None]:
    """Register ``texts[True]`` pinned and ``texts[False]`` unpinned, run the churn rounds with one user request per
    prefix after each (the order alternating by round), and report each, plus vLLM's own token-level hit rate over
    the run (its /metrics counters; churn and warms included). A user request hits when every full block of it
    that lies inside its prefix came from the cache. A progress bar (stderr) counts the rounds unless ``quiet``."""
    from ragcache.observe.progress import progress_bar

    rng = random.Random(churn.seed)
    names = {True: "bench-pinned", False: "bench-unpinned"}
    num_tokens = {pinned: count_tokens(http, target, text) for pinned, text in texts.items()}
    latencies: dict[bool, dict[bool, list[float]]] = {pinned: {True: [], False: []} for pinned in texts}
    before = registry.scrape(target.base_url)
    for pinned, text in texts.items():
        registry.register(PrefixSpec(names[pinned], text, target, pinned=pinned))
    try:
        with progress_bar(desc="prefixes (pinned | unpinned)", unit="round", total=churn.num_rounds, quiet=quiet) as bar:
            for round_no in range(churn.num_rounds):
                for _ in range(churn.churn_per_round):
                    # Token-id prompts: exact length, never shared with anything else, so each one takes
                    # fresh KV blocks and pushes the least recently used ones out.
                    _complete(http, target, [rng.randrange(3, churn.vocab_size) for _ in range(churn.churn_tokens)])
                    time.sleep(churn.churn_interval_s)
                question = f"Question {round_no} ({rng.random():.12f}): why?"
                for pinned in (True, False) if round_no % 2 == 0 else (False, True):
                    start = time.perf_counter()
                    usage = _complete(http, target, texts[pinned] + question)["usage"]
                    latency = time.perf_counter() - start
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                    latencies[pinned][judge_residency(num_tokens[pinned], cached, block_size)].append(latency)
                bar.update(1)
        num_warms = {pinned: registry.prefix_stats(names[pinned]).num_warms for pinned in texts}
    finally:
        for name in names.values():
            registry.delete(name)
    after = registry.scrape(target.base_url)
    vllm_hit_rate = None
    if before is not None and after is not None and after.queries > before.queries:
        vllm_hit_rate = round((after.hits - before.hits) / (after.queries - before.queries), 3)
    results = {pinned: RunResult(pinned, churn.num_rounds, len(latencies[pinned][True]),
                                 tuple(latencies[pinned][True]), tuple(latencies[pinned][False]), num_warms[pinned])
               for pinned in texts}
    return results, vllm_hit_rate


def _ms(values: tuple[float, ...], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def summarize(results: dict[bool, RunResult], vllm_hit_rate: float | None, churn: ChurnConfig,
              extra: dict[str, Any]) -> dict[str, Any]:
    """The JSON details: hit rates, and latency of pinned-hit vs evicted requests (median, p90)."""
    pinned, unpinned = results[True], results[False]
    return {
        "churn": asdict(churn),
        **extra,
        "hit_rate_pinned": round(pinned.hit_rate, 3),
        "hit_rate_unpinned": round(unpinned.hit_rate, 3),
        "num_warms_pinned": pinned.num_warms,
        "vllm_token_hit_rate": vllm_hit_rate,
        "latency_ms_pinned_hit": {"p50": _ms(pinned.latencies_hit_s, 0.5), "p90": _ms(pinned.latencies_hit_s, 0.9),
                                  "n": len(pinned.latencies_hit_s)},
        "latency_ms_evicted": {"p50": _ms(unpinned.latencies_miss_s, 0.5), "p90": _ms(unpinned.latencies_miss_s, 0.9),
                               "n": len(unpinned.latencies_miss_s)},
    }


def verdicts(details: dict[str, Any]) -> BenchResult:
    """Pinned hit rate >= 0.9; the pinned prefix's hits faster (median) than the unpinned one's misses."""
    result = BenchResult("prefixes", "pinned vs unpinned prefix under the same churn, side by side")
    result.add("hit rate, pinned (keep-warm)", details["hit_rate_pinned"], target=Goal(">=", 0.9),
               note=f"{details['num_warms_pinned']} warms; unpinned {details['hit_rate_unpinned']}")
    hit, evicted = details["latency_ms_pinned_hit"], details["latency_ms_evicted"]
    ratio = round(hit["p50"] / evicted["p50"], 3) if hit["p50"] and evicted["p50"] else None
    result.add("latency p50 pinned hit / evicted", ratio, "x", target=Goal("<=", 1.0),
               note=f"{hit['p50']} vs {evicted['p50']} ms (n {hit['n']} / {evicted['n']})")
    return result


def print_table(report: dict[str, Any]) -> None:
    """A small human-readable table of the report."""
    hit, ev = report["latency_ms_pinned_hit"], report["latency_ms_evicted"]
    print(f"prefix: {report['prefix_tokens']} tokens; churn: {report['churn']['num_rounds']} rounds x "
          f"{report['churn']['churn_per_round']} x {report['churn']['churn_tokens']} tokens; "
          f"KV cache {report['kv_cache_tokens']} tokens; both prefixes side by side on the same churn")
    print(f"{'':24}{'hit rate':>10}{'p50 ms':>10}{'p90 ms':>10}{'n':>6}")
    print(f"{'pinned (keep-warm)':24}{report['hit_rate_pinned']:>10}{hit['p50']!s:>10}{hit['p90']!s:>10}{hit['n']:>6}")
    print(f"{'unpinned (evicted)':24}{report['hit_rate_unpinned']:>10}{ev['p50']!s:>10}{ev['p90']!s:>10}{ev['n']:>6}")
    print(f"warm requests sent for the pinned prefix: {report['num_warms_pinned']}; vLLM's own token hit rate "
          f"(/metrics, churn included): {report['vllm_token_hit_rate']}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``ragcache bench prefixes``."""
    parser.add_argument("--base-url", help="use this running vLLM instead of starting one")
    parser.add_argument("--model", default="tiny-llama", help="served model name (with --base-url)")
    parser.add_argument("--vllm-python", type=Path, default=Path(".venv-vllm/bin/python"), help="the vLLM environment's Python")
    parser.add_argument("--model-path", type=Path, default=Path(".cache/tiny-llama"), help="the model folder vLLM serves")
    parser.add_argument("--num-blocks", type=int, default=128, help="KV blocks of the server it starts")
    parser.add_argument("--block-size", type=int, default=32, help="tokens per KV block")
    parser.add_argument("--prefix-tokens", type=int, default=1000, help="tokens of the shared system prompt")
    parser.add_argument("--rounds", type=int, default=ChurnConfig.num_rounds, help="churn rounds per configuration")
    parser.add_argument("--churn-per-round", type=int, default=ChurnConfig.churn_per_round, help="churn prompts sent per round")
    parser.add_argument("--churn-tokens", type=int, default=ChurnConfig.churn_tokens, help="tokens per churn prompt")
    parser.add_argument("--churn-interval-s", type=float, default=ChurnConfig.churn_interval_s, help="pause between churn prompts")
    parser.add_argument("--seed", type=int, default=ChurnConfig.seed, help="seed of the churn")
    # This churn cycles the 4,096-token KV cache within a round (about a second): the registry's defaults
    # (re-warm every 1 s at the shortest) are too slow for it, so the bench re-warms faster.
    parser.add_argument("--min-rewarm-s", type=float, default=0.1, help="the registry's shortest re-warm interval")
    parser.add_argument("--max-rewarm-s", type=float, default=1.0, help="the registry's longest re-warm interval")
    parser.add_argument("--warm-budget-per-minute", type=int, default=600, help="the registry's warm requests per minute")
    parser.add_argument("--json-out", type=Path, default=Path("bench-results/prefixes.json"), help="where the JSON results go")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> BenchResult:
    """Both prefixes side by side on one churn; print the table, write the JSON, return the verdicts."""
    started = time.perf_counter()
    machine = machine_info()  # now: the commit that runs, not the one checked out when it ends
    server = None
    if args.base_url is None:
        server = VLLMServer(VLLMServerConfig(python=args.vllm_python, model=args.model_path,
                                             block_size=args.block_size, num_blocks=args.num_blocks,
                                             scheduling_policy="priority",
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
    churn = ChurnConfig(args.rounds, args.churn_per_round, args.churn_tokens, args.churn_interval_s, seed=args.seed)
    try:
        with httpx.Client(timeout=60) as http:
            registry = PrefixRegistry.create(config, http=http)
            registry.start()
            try:
                texts = prefix_pair(http, target, args.prefix_tokens)
                results, vllm_hit_rate = run_side_by_side(registry, http, target, texts, churn,
                                                          block_size=args.block_size, quiet=args.quiet)
                num_tokens = {pinned: count_tokens(http, target, text) for pinned, text in texts.items()}
            finally:
                registry.close()
    finally:
        if server is not None:
            server.stop()
    details = summarize(results, vllm_hit_rate, churn, {
        "prefix_tokens": num_tokens[True], "unpinned_prefix_tokens": num_tokens[False],
        "kv_cache_tokens": args.num_blocks * args.block_size,
        "registry": {"min_rewarm_interval_s": args.min_rewarm_s, "max_rewarm_interval_s": args.max_rewarm_s,
                     "warm_budget_per_minute": args.warm_budget_per_minute, "tick_interval_s": config.tick_interval_s,
                     "warm_priority": config.warm_priority, "warm_max_waiting": config.warm_max_waiting},
        "vllm_startup_s": round(server.startup_s, 1) if server and server.startup_s else None,
    })
    print_table(details)
    result = verdicts(details)
    result.details = details
    result.seconds = time.perf_counter() - started
    print(format_table([result]))
    write_json(args.json_out, {"mode": "full", "command": command_line("prefixes"), "machine": machine,
                               "result": result.to_dict()})
    return result


def prefix_pair(http: httpx.Client, target: Target, num_tokens: int) -> dict[bool, str]:
    """Two different prefixes of the same rules (so of about the same length): True is pinned, False is not."""
    text = build_prefix_text(http, target, num_tokens)
    return {True: text, False: text.replace("You are a retrieval assistant.", "You are a research assistant.", 1)}


def main() -> int:
    from ragcache_bench import exit_status

    parser = argparse.ArgumentParser(description="Prefix keep-warm benchmark against a real vLLM")
    add_arguments(parser)
    return exit_status([run(parser.parse_args())])


if __name__ == "__main__":
    raise SystemExit(main())
