"""``ragcache bench``: rerunnable benchmarks that print a table (target, PASS/MISS) and write JSON.

    ragcache bench all --quick            # every benchmark, under ten minutes on two cores
    ragcache bench l2 --out bench-results # one benchmark

Timings are medians of repeated runs, and every ratio is measured side by side in one process, against
the same model object, the same Redis and the same seeded Zipf stream over standard-library prose.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BENCHMARKS", "add_bench_commands", "main", "missing_extra", "run_benchmarks"]


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str  # imported only when run: keeps `ragcache --help` fast
    function: str
    help: str
    needs: tuple[str, ...] = ()  # modules of ragcache's `bench` extra it imports (the peers it races)

    def load(self) -> Callable:
        return getattr(importlib.import_module(self.module), self.function)

    def missing(self) -> list[str]:
        return [module for module in self.needs if importlib.util.find_spec(module) is None]


# The peer caches `bench zipf` and `bench l2` race: ragcache's `bench` extra (pyproject.toml), which `make bench`
# installs; without it those benchmarks say so instead of failing on an import.
PEER_CACHES = ("langchain_community", "langchain_classic", "redisvl")
BENCH_EXTRA_HINT = "pip install 'ragcache[bench]' (in a checkout: make bench, or .venv/bin/pip install -e '.[bench]')"


# The order `bench all` runs them in: library benchmarks first (they fill the shared vector memo, so the
# later ones seed instead of computing), the HTTP service last (one service process shared by both).
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("zipf", "ragcache_bench.library_zipf", "bench_zipf", "a Zipf stream through ragcache and its peers side by side:"
                  " hit rates against the ideal",
                  needs=PEER_CACHES),
        Benchmark("l2", "ragcache_bench.library_l2", "bench_l2", "1,000 keys read from L2 against a bare MGET,"
                  " LangChain's and RedisVL's caches",
                  needs=PEER_CACHES),
        Benchmark("misses", "ragcache_bench.library_misses", "bench_misses", "every text a miss:"
                  " the cache's cost on top of the bare model"),
        Benchmark("concurrency", "ragcache_bench.library_misses", "bench_concurrency",
                  "concurrent misses for the same texts computed once, and batched"),
        Benchmark("scale", "ragcache_bench.library_scale", "bench_scale", "lookup cost with 10k to 1M entries per level, and L1's memory"),
        Benchmark("levels", "ragcache_bench.levels", "bench_levels", "one embed call served entirely by L1, L2, L3 or computed"),
        Benchmark("cluster", "ragcache_bench.cluster", "bench_cluster",
                  "L2 get/put_many: 3-primary Redis Cluster vs one Redis, side by side"),
        Benchmark("http", "ragcache_bench.http", "bench_http", "the service: /embed from L1 against computed, and texts/s under load"),
        Benchmark("overhead", "ragcache_bench.overhead", "bench_overhead",
                  "ragcache's own CPU per text in front of an instant upstream: miss, hit, texts/s against the upstream"),
        Benchmark("http-floor", "ragcache_bench.http_floor", "bench_http_floor",
                  "L1 hits and the upstream call against bare ones; uvicorn against Granian on ragcache's own app",
                  needs=("granian",)),
        Benchmark("cold", "ragcache_bench.cold", "bench_cold",
                  "a cold Zipf stream (full: 20,480 texts) through the service against MGET + encode the misses + SET"),
        Benchmark("search", "ragcache_bench.http", "bench_search", "/search over 100k documents: a repeated query against a first one"),
        Benchmark("retrieval", "ragcache_bench.retrieval", "bench_retrieval",
                  "nDCG/recall@10 of dense, keyword, hybrid on FAQ questions people wrote (WordNet second)"),
        Benchmark("sync", "ragcache_bench.sync", "bench_sync", "ragcache ingest --sync of a 10k-document folder in which nothing changed"),
        Benchmark("replicas", "ragcache_bench.replicas", "bench_replicas",
                  "two replicas on one Redis + Milvus server: shared hits, single flight"),
        Benchmark("providers", "ragcache_bench.providers", "bench_providers",
                  "in front of a real upstream (Infinity) vs the upstream alone: hot, all-miss, tokens saved"),
        Benchmark("compute", "ragcache_bench.compute", "bench_compute",
                  "computed texts/s: torch, ONNX and ONNX-int8 against fastembed and Infinity, side by side"),
        Benchmark("ray", "ragcache_bench.ray", "bench_ray",
                  "bulk embedding on a 2-node Ray cluster: 1 against 2 actors; computed texts against a plain Ray Data pipeline"),
    )
}
# Left out of `bench all`: they need an extra environment (the Infinity venv, `make infinity-env`; compute also
# `make fastembed-env`; ray the ray extra, `make ray-env`).
NOT_IN_ALL = ("providers", "compute", "ray")


def add_bench_commands(subparsers) -> argparse.ArgumentParser:
    """Register ``bench`` with its subcommands on an argparse subparsers object (the ``ragcache`` CLI's)."""
    bench = subparsers.add_parser("bench", help="run benchmarks (table + JSON)", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    every = commands.add_parser("all", help="every benchmark below but providers, compute, ray (they need their own environments), "
                                "prefixes, kv, kv-route (vLLM), load and gpu-l1")
    _add_common(every)
    every.set_defaults(run=_run_command, benchmarks=[name for name in BENCHMARKS if name not in NOT_IN_ALL])
    for benchmark in BENCHMARKS.values():
        parser = commands.add_parser(benchmark.name, help=benchmark.help)
        _add_common(parser)
        parser.set_defaults(run=_run_command, benchmarks=[benchmark.name])
    _add_vllm(commands, "prefixes", "KV-prefix registry against a vLLM server (needs vLLM)")
    _add_vllm(commands, "kv", "TTFT and tokens/s at concurrency 1-16, prefix caching off/on/kept warm (needs vLLM)")
    _add_vllm(commands, "kv-route", "routing by prefix residency vs round-robin, two vLLM replicas with KV events (needs vLLM)")
    _add_load(commands)
    _add_soak(commands)
    _add_gpu_l1(commands)
    return bench


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smaller workloads (bench all --quick: < 10 min on 2 cores)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for the JSON results")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Zipf stream")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_vllm(commands, name: str, help: str) -> None:  # noqa: A002 - argparse's name
    """``bench prefixes`` / ``bench kv`` / ``bench kv-route`` (against vLLM) when the module is present (``kv-route`` is
    ``ragcache_bench.kv_route``); never part of ``all``."""
    module_name = f"ragcache_bench.{name.replace('-', '_')}"
    if importlib.util.find_spec(module_name) is None:
        return
    module = importlib.import_module(module_name)
    parser = commands.add_parser(name, help=help)
    module.add_arguments(parser)
    # run() prints its own tables and writes the JSON; its verdicts decide the exit status, as for the rest.
    parser.set_defaults(run=lambda args: exit_status([module.run(args)]))


def _add_gpu_l1(commands) -> None:
    """``bench gpu-l1``: the device L1 checked against the CPU one and timed (its own flags: ``--device``)."""
    parser = commands.add_parser("gpu-l1", help="L1 on a CUDA device: bit-exact vs CPU, no host round trip, lookup cost")
    add_gpu_l1_arguments(parser)
    parser.set_defaults(run=lambda args: importlib.import_module("ragcache_bench.gpu_l1").run(args))


def add_gpu_l1_arguments(parser: argparse.ArgumentParser) -> None:
    # Here, not in gpu_l1: building the CLI must not import torch.
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (default: cuda)")
    parser.add_argument("--entries", type=int, default=100_000, help="vectors resident in each slab")
    parser.add_argument("--repeats", type=int, default=50, help="timed repeats per size (median reported)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/gpu_l1.json"), help="where the JSON results go")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_load(commands) -> None:
    """``bench load``: a bounded mixed load on the service (``--duration``, ``--clients``); never part of ``all``."""
    from ragcache_bench import load

    parser = commands.add_parser("load", help="mixed /embed, /v1/embeddings, /search load: zero errors, stable memory")
    load.add_arguments(parser)
    parser.set_defaults(run=load.run)


def _add_soak(commands) -> None:
    """``bench soak``: the service on its embedded defaults under steady load for ``--seconds``, every process's memory
    sampled (levels off, or not); never part of ``all``."""
    from ragcache_bench import soak

    parser = commands.add_parser("soak", help="steady load for --seconds on the embedded defaults: every process's memory levels off")
    soak.add_arguments(parser)
    parser.set_defaults(run=soak.run)


def _run_command(args: argparse.Namespace) -> int:
    problem = missing_extra([BENCHMARKS[name] for name in args.benchmarks])
    if problem is not None:
        print(f"ragcache bench {args.bench_command}: {problem}", file=sys.stderr)
        return 2
    command = f"ragcache bench {args.bench_command}" + (" --quick" if args.quick else "") + f" --out {args.out}"
    if args.seed:
        command += f" --seed {args.seed}"
    results = run_benchmarks(args.benchmarks, quick=args.quick, out=args.out, seed=args.seed, command=command, quiet=args.quiet)
    return exit_status(results)


def missing_extra(benchmarks: list[Benchmark]) -> str | None:
    """What to install when a benchmark needs modules of the `bench` extra that are not there; None when none is missing."""
    missing = {benchmark.name: benchmark.missing() for benchmark in benchmarks if benchmark.missing()}
    if not missing:
        return None
    modules = ", ".join(sorted({module for found in missing.values() for module in found}))
    verb = "races" if len(missing) == 1 else "race"
    return (f"{', '.join(missing)} {verb} the peer caches of ragcache's `bench` extra, which is not installed "
            f"(missing: {modules}): {BENCH_EXTRA_HINT}")


def exit_status(results: list) -> int:
    """0 when every target passed; 1 when any missed (a crashed benchmark is a MISS), so a script or CI
    that runs ``ragcache bench`` sees a regression without reading the table."""
    return 1 if not results or any(result.num_missed for result in results) else 0


def run_benchmarks(names: list[str], *, quick: bool, out: Path, seed: int = 0, command: str = "", quiet: bool = False) -> list:
    """Run benchmarks in one process (one model, one Redis), print each table as it finishes, the whole
    table at the end, and write ``<out>/<name>.json`` per benchmark plus ``<out>/all.json`` for several.
    A progress bar over the benchmarks goes to stderr (``quiet`` turns it off)."""
    from ragcache.observe.progress import progress_bar
    from ragcache_bench.context import BenchContext
    from ragcache_bench.report import BenchResult, format_table, machine_info, summary_line, write_json

    started = time.perf_counter()
    results: list[BenchResult] = []
    machine = machine_info()
    mode = "quick" if quick else "full"
    command = command or "ragcache bench " + " ".join(names)
    with BenchContext(quick=quick, seed=seed) as ctx, progress_bar(desc="bench", unit="benchmark", total=len(names), quiet=quiet) as bar:
        for name in names:
            benchmark = BENCHMARKS[name]
            bar.set_postfix_str(name)
            _say(f"\n== {name}: {benchmark.help}")
            t0 = time.perf_counter()
            try:
                result = benchmark.load()(ctx)
            except Exception as exc:  # noqa: BLE001 - one failed benchmark must not lose the others' figures
                traceback.print_exc()
                result = BenchResult(name, benchmark.help)
                result.crashed(exc)
            result.seconds = time.perf_counter() - t0
            results.append(result)
            _say(format_table([result]) + f"\n({result.seconds:.1f} s)")
            bar.update(1)
            write_json(out / f"{name}.json", {"mode": mode, "command": command, "machine": machine, "result": result.to_dict()})
    elapsed = time.perf_counter() - started
    if len(results) > 1:
        print("\n== all results\n" + format_table(results))
        write_json(out / "all.json", {"mode": mode, "command": command, "seconds": round(elapsed, 1), "machine": machine,
                                      "summary": summary_line(results), "results": [r.to_dict() for r in results]})
    print(f"\n{summary_line(results)}; {elapsed:.0f} s; JSON in {out}/")
    return results


def _say(text: str) -> None:
    """Print above the progress bar (tqdm.write clears and redraws it), at once even into a pipe."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ragcache")
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)
