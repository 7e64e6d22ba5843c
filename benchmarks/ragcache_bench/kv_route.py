"""Routing by prefix residency against round-robin (issue 30, target 3): two vLLM replicas with KV events, two long
system prompts whose KV does not fit on one replica beside the traffic.

    ragcache bench kv-route --vllm-python .venv-vllm/bin/python --model-path .cache/tiny-llama

Each request is one of the two prompts (drawn at random) plus a unique question of ``suffix_tokens`` random token ids,
``concurrency`` in flight; ``routed`` sends it where ``PrefixRegistry.route`` says (the replica holding the prefix by
the engines' events; where none does, the one with the most room), ``round_robin`` to the replicas in turn. The two
modes run on the same two servers in alternating blocks (``rounds`` each), so load drift lands on both. Reported per
mode: cached prompt tokens per request (``usage.prompt_tokens_details.cached_tokens``) and the latency p50 of a
one-token completion (its TTFT). Targets: routed cached tokens >= 1.8x round-robin's; routed TTFT p50 <= round-robin's.
The prefixes are registered unpinned: nothing warms them, the routing alone decides where their blocks live.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from ragcache.prefixes import EventsConfig, PrefixRegistry, PrefixRegistryConfig, PrefixSpec, Target
from ragcache.storage.processes import free_port
from ragcache_bench.prefixes import build_prefix_text
from ragcache_bench.report import BenchResult, command_line, format_table, machine_info, write_json
from ragcache_bench.report import Target as Goal
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

__all__ = ["add_arguments", "main", "run"]


@dataclass(frozen=True)
class ModeResult:
    mode: str
    num_requests: int
    cached_tokens_per_request: float
    prompt_tokens_per_request: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    num_errors: int


def _request(http: httpx.Client, url: str, model: str, prompt: list[int]) -> tuple[float, int, int] | None:
    start = time.perf_counter()
    try:
        r = http.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1})
        r.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"request failed: {exc}"[:300])
        return None
    usage = r.json()["usage"]
    return time.perf_counter() - start, (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0, \
        usage["prompt_tokens"]


def _block(mode: str, registry: PrefixRegistry, http: httpx.Client, urls: list[str], model: str,
           prompts: dict[str, list[int]], args: argparse.Namespace, rng: random.Random,
           reasons: Counter[str]) -> list[tuple[float, int, int] | None]:
    names = sorted(prompts)
    turn = iter(range(10**9))
    lock = threading.Lock()

    def one(i: int, timed: bool = True) -> tuple[float, int, int] | None:
        with lock:
            # Drawn, not alternated: alternating both the prompt and the replica would pair each prompt with one
            # replica and make round-robin a perfect partition by accident.
            name = rng.choice(names)
            suffix = [rng.randrange(3, 8000) for _ in range(args.suffix_tokens)]
            if mode == "routed":
                route = registry.route(name)
                url = route.endpoint
                if timed:
                    reasons[f"{name} -> replica {urls.index(url)}: {route.reason}"] += 1
            else:
                url = urls[next(turn) % len(urls)]
        return _request(http, url, model, prompts[name] + suffix)

    with ThreadPoolExecutor(args.concurrency) as pool:
        # Untimed first: the replicas hold what the other mode left; a block measures its own mode's steady state.
        list(pool.map(lambda i: one(i, timed=False), range(args.settle_requests)))
        return list(pool.map(one, range(args.requests_per_block)))


def _summary(mode: str, samples: list[tuple[float, int, int] | None]) -> ModeResult:
    ok = [s for s in samples if s is not None]
    latencies = sorted(s[0] * 1000 for s in ok)
    return ModeResult(mode, len(ok), round(statistics.fmean(s[1] for s in ok), 1), round(statistics.fmean(s[2] for s in ok), 1),
                      round(latencies[len(latencies) // 2], 1), round(latencies[int(len(latencies) * 0.9)], 1),
                      len(samples) - len(ok))


def run(args: argparse.Namespace) -> BenchResult:
    machine = machine_info()
    started = time.perf_counter()
    with ExitStack() as stack, httpx.Client(timeout=300) as http:
        servers = []
        for i in range(2):
            server = VLLMServer(VLLMServerConfig(
                python=args.vllm_python, model=args.model_path, block_size=args.block_size, num_blocks=args.num_blocks,
                kv_events_port=free_port(), kv_replay_port=free_port(),
                log_path=Path(tempfile.gettempdir()) / f"ragcache-bench-kv-route-{i}.log"))
            servers.append(stack.enter_context(server))
        urls = [s.base_url for s in servers]
        model = servers[0].config.served_model_name
        events = {s.base_url: EventsConfig(s.config.kv_events_endpoint or "", s.config.kv_replay_endpoint) for s in servers}
        registry = PrefixRegistry.create(PrefixRegistryConfig(
            file_path=Path(tempfile.mkdtemp()) / "prefixes.json", default_block_size=args.block_size, metrics_interval_s=0.5,
            kv_events=events), http=http)
        stack.callback(registry.close)
        registry.start()
        texts = {name: build_prefix_text(http, Target(urls[0], model), args.prefix_tokens).replace(
            "retrieval assistant", f"{name} assistant", 1) for name in ("alpha", "beta")}
        prompts = {}
        for name, text in texts.items():
            registry.register(PrefixSpec(name, text, Target(urls[0], model), pinned=False, endpoints=(urls[1],)))
            tokens = http.post(f"{urls[0]}/tokenize", json={"model": model, "prompt": text}).json()["tokens"]
            prompts[name] = tokens
        rng = random.Random(7)
        samples: dict[str, list] = {"routed": [], "round_robin": []}
        reasons: Counter[str] = Counter()
        for round_no in range(args.rounds):
            for mode in (("routed", "round_robin") if round_no % 2 == 0 else ("round_robin", "routed")):
                samples[mode] += _block(mode, registry, http, urls, model, prompts, args, rng, reasons)
    # The most a request can find cached: its prompt's full blocks (the suffix is unique to it), so the ratio below
    # cannot exceed cacheable / round-robin's, however well the route does.
    cacheable = round(statistics.fmean(len(p) // args.block_size * args.block_size for p in prompts.values()), 1)
    rows = [_summary(mode, s) for mode, s in samples.items()]
    by = {r.mode: r for r in rows}
    result = BenchResult("kv-route", "routing by prefix residency against round-robin, two vLLM replicas (alternating blocks)")
    routed, rr = by["routed"], by["round_robin"]
    no_errors = {"every request answered": routed.num_errors + rr.num_errors == 0}
    result.add("cached tokens per request, routed / round-robin",
               round(routed.cached_tokens_per_request / rr.cached_tokens_per_request, 2) if rr.cached_tokens_per_request else None,
               "x", target=Goal(">=", 1.8), note=f"{routed.cached_tokens_per_request} vs {rr.cached_tokens_per_request} of "
               f"{routed.prompt_tokens_per_request} tokens", requires=no_errors)
    result.add("cached tokens per request, round-robin / cacheable", round(rr.cached_tokens_per_request / cacheable, 3),
               "x", note=f"{rr.cached_tokens_per_request} of {cacheable}: the routed / round-robin ratio's ceiling is "
               f"{round(cacheable / rr.cached_tokens_per_request, 2) if rr.cached_tokens_per_request else None}x")
    result.add("cached tokens per request, routed / cacheable", round(routed.cached_tokens_per_request / cacheable, 3),
               "x", note=f"{routed.cached_tokens_per_request} of {cacheable}")
    result.add("TTFT p50 routed / round-robin", round(routed.ttft_p50_ms / rr.ttft_p50_ms, 3), "x", target=Goal("<=", 1.0),
               note=f"{routed.ttft_p50_ms} vs {rr.ttft_p50_ms} ms (p90 {routed.ttft_p90_ms} vs {rr.ttft_p90_ms})",
               requires=no_errors)
    result.seconds = time.perf_counter() - started
    result.details = {"rows": [asdict(r) for r in rows], "cacheable_tokens_per_request": cacheable,
                      "route_reasons": dict(sorted(reasons.items())),
                      "config": {k: str(v) for k, v in vars(args).items()}}
    print("\n".join(f"| {r.mode} | {r.num_requests} | {r.num_errors} | {r.cached_tokens_per_request} of "
                    f"{r.prompt_tokens_per_request} | {r.ttft_p50_ms} | {r.ttft_p90_ms} |" for r in rows))
    print(format_table([result]))
    write_json(args.json_out, {"mode": "full", "command": command_line("kv-route"), "machine": machine,
                               "result": result.to_dict()})
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``ragcache bench kv-route`` (and of ``python -m ragcache_bench.kv_route``)."""
    parser.add_argument("--vllm-python", type=Path, default=Path(".venv-vllm/bin/python"), help="the vLLM environment's Python")
    parser.add_argument("--model-path", type=Path, default=Path(".cache/tiny-llama"), help="the model folder vLLM serves")
    # The defaults: each request (a 1,955-token prompt + 64 unique tokens) fills 64 of a replica's 66 blocks, so the
    # prompt evicted by the other keeps at most 2 blocks and round-robin finds ~half (issue 42: 2.03x). With more room
    # (1,400-token prompts, 160-token questions, 72 blocks: the shape before), round-robin keeps the evicted prompt's
    # head and the ratio's ceiling is 1.61x, below the 1.8x target whatever the route does.
    parser.add_argument("--num-blocks", type=int, default=66,
                        help="KV blocks of each server: one prompt and the traffic fit, both prompts and the traffic do not")
    parser.add_argument("--block-size", type=int, default=32, help="tokens per KV block")
    parser.add_argument("--prefix-tokens", type=int, default=1900, help="tokens of each system prompt (at least)")
    parser.add_argument("--suffix-tokens", type=int, default=64, help="unique tokens after the prompt, per request")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent clients")
    parser.add_argument("--requests-per-block", type=int, default=24, help="requests per timed block")
    parser.add_argument("--rounds", type=int, default=4, help="alternating blocks per policy")
    parser.add_argument("--settle-requests", type=int, default=8,
                        help="untimed requests at the start of each block, in its own mode (0 before issue 42's re-run)")
    parser.add_argument("--json-out", type=Path, default=Path("bench-results/kv-route.json"), help="where the JSON results go")


def main() -> int:
    from ragcache_bench import exit_status

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return exit_status([run(parser.parse_args())])


if __name__ == "__main__":
    raise SystemExit(main())
