"""Verdicts, the table and the JSON of the benchmarks, and the ``bench`` command line wiring."""

from __future__ import annotations

import argparse
import json

import pytest

from ragcache_bench import BENCHMARKS, NOT_IN_ALL, add_bench_commands
from ragcache_bench.report import BenchResult, Figure, Target, format_table, interleaved, summary_line, write_json


@pytest.mark.parametrize(
    ("op", "threshold", "value", "verdict"),
    [
        (">=", 100, 100.0, "PASS"),
        (">=", 100, 99.99, "MISS"),
        ("<=", 1.5, 1.5, "PASS"),
        ("<=", 1.5, 1.51, "MISS"),
        ("==", 0.75, 0.75, "PASS"),
        ("==", 0.75, 0.7501, "MISS"),
        (">=", 0.6, float("nan"), "MISS"),
    ],
)
def test_verdicts(op, threshold, value, verdict):
    assert Figure("f", value, target=Target(op, threshold)).verdict == verdict


def test_a_figure_without_a_number_misses_its_target():
    assert Figure("f", "error: boom", target=Target(">=", 1)).verdict == "MISS"
    assert Figure("f", 3.0).verdict == ""


def test_unknown_operator_is_refused():
    with pytest.raises(ValueError):
        Target(">", 1)


def test_table_lists_every_figure_with_target_and_verdict():
    result = BenchResult("l2", "title")
    result.add("ragcache", 123456.7, "keys/s")
    result.add("ragcache / floor", 0.71, "x", target=Target(">=", 0.6), goal="3", note="side by side")
    result.add("ragcache / LangChain", 4.2, "x", target=Target(">=", 5), goal="3")
    lines = format_table([result]).splitlines()
    assert lines[0].split() == ["bench", "goal", "figure", "value", "target", "verdict", "note"]
    assert "123,457 keys/s" in lines[2]
    assert ">= 0.6 x" in lines[3] and "PASS" in lines[3]
    assert ">= 5 x" in lines[4] and lines[4].rstrip().endswith("MISS")
    assert summary_line([result]) == "1 PASS, 1 MISS of 2 targets"


def test_json_holds_figures_verdicts_and_details(tmp_path):
    result = BenchResult("zipf", "stream")
    result.add("hit rate", 0.75, target=Target("==", 0.75), goal="5")
    result.details = {"samples": [1.0, 2.0]}
    path = write_json(tmp_path / "zipf.json", {"result": result.to_dict()})
    loaded = json.loads(path.read_text())["result"]
    assert loaded["figures"][0]["verdict"] == "PASS"
    assert loaded["figures"][0]["target"] == "== 0.75"
    assert loaded["details"] == {"samples": [1.0, 2.0]}


def test_interleaved_rotates_the_order_and_skips_warmup():
    calls = []
    samples = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1,
                          before={"a": lambda: calls.append("before-a")})
    assert calls == ["before-a", "a", "b", "b", "before-a", "a", "before-a", "a", "b", "b", "before-a", "a"]
    assert [len(v) for v in samples.values()] == [3, 3]


def test_bench_commands_register_all_and_each_benchmark():
    parser = argparse.ArgumentParser(prog="ragcache")
    add_bench_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "all", "--quick", "--out", "somewhere"])
    assert args.quick and str(args.out) == "somewhere"
    # Every benchmark but those that need an extra environment (providers: the Infinity venv).
    assert args.benchmarks == [name for name in BENCHMARKS if name not in NOT_IN_ALL] and "providers" in NOT_IN_ALL
    for name in BENCHMARKS:
        assert parser.parse_args(["bench", name]).benchmarks == [name]
    assert {"zipf", "l2", "misses", "concurrency", "scale", "http", "search"} <= set(BENCHMARKS)


def test_bench_kv_route_takes_its_flags_and_stays_out_of_all():
    parser = argparse.ArgumentParser(prog="ragcache")
    add_bench_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "kv-route", "--rounds", "2", "--model-path", "m"])
    assert (args.bench_command, args.rounds, str(args.model_path), str(args.vllm_python)) == \
        ("kv-route", 2, "m", ".venv-vllm/bin/python")
    assert "kv-route" not in parser.parse_args(["bench", "all"]).benchmarks


def test_markdown_table_from_json():
    from ragcache_bench.report import markdown_from_json

    result = BenchResult("http", "service")
    result.add("/embed computed / L1", 765.5, "x", target=Target(">=", 100), goal="1", note="a|b")
    lines = markdown_from_json({"results": [result.to_dict()]}).splitlines()
    assert lines[0].startswith("| bench | goal |")
    assert lines[2] == "| http | 1 | /embed computed / L1 | 765.5 x | >= 100 x | **PASS** | a\\|b |"


def test_a_failed_precondition_makes_a_figure_miss_even_when_its_number_passes():
    passing = Figure("computed / L1", 500.0, "x", target=Target(">=", 100), requires=(("every text from L1", True),))
    wrong_path = Figure("computed / L1", 500.0, "x", target=Target(">=", 100), requires=(("every text from L1", False),))
    assert passing.verdict == "PASS" and wrong_path.verdict == "MISS"
    assert wrong_path.annotated_note().startswith("precondition failed: every text from L1")
    # A precondition alone judges a figure; True is never a number that passes a target.
    assert Figure("hit rate", 0.8, requires=(("computed once", True),)).verdict == "PASS"
    assert Figure("flag", True, target=Target("==", 1)).verdict == "MISS"


def test_a_crashed_benchmark_is_a_miss_and_makes_the_command_fail():
    from ragcache_bench import exit_status

    crashed = BenchResult("zipf", "stream")
    crashed.crashed(RuntimeError("boom"))
    fine = BenchResult("l2", "keys")
    fine.add("ratio", 2.0, "x", target=Target(">=", 1))
    assert crashed.verdicts == ["MISS"] and "RuntimeError: boom" in crashed.figures[0].value
    assert summary_line([fine, crashed]) == "1 PASS, 1 MISS of 2 targets"
    assert exit_status([fine]) == 0
    assert exit_status([fine, crashed]) == 1
    assert exit_status([]) == 1


def test_exact_lru_simulation_counts_hits_to_the_item():
    from ragcache_bench.library_zipf import simulate_exact_lru

    # Capacity 2. Request 1 computes a, b. Request 2: a hits; c computed, evicting b (a was just used).
    # Request 3: b was evicted (found in L2, written back: evicts a... no: a and c are resident, b evicts
    # the least recent, a); c hits once, counted per input (twice).
    assert simulate_exact_lru([[0, 1], [0, 2], [1, 2, 2]], capacity=2) == 1 + 2
    # Written-back L2 hits land before newly computed ones: with capacity 1 the computed one stays.
    assert simulate_exact_lru([[0], [1], [0, 2], [2]], capacity=1) == 1


def test_an_implausible_speed_up_is_a_noisy_run_not_a_pass():
    from ragcache_bench.report import plausible

    honest = Figure("ragcache / floor", 0.97, target=Target(">=", 0.95), requires=tuple(plausible(0.97, 1.1).items()))
    assert honest.verdict == "PASS"
    noisy = Figure("ragcache / floor", 1.87, target=Target(">=", 0.95), requires=tuple(plausible(1.87, 1.1).items()))
    assert noisy.verdict == "MISS"
    assert "noisy run" in noisy.annotated_note()
    assert Figure("f", 1.1, target=Target(">=", 0.95), requires=tuple(plausible(1.1, 1.1).items())).verdict == "PASS"


def test_a_benchmark_whose_peer_caches_are_not_installed_says_which_extra_to_install():
    from ragcache_bench import Benchmark, missing_extra

    absent = Benchmark("l2", "ragcache_bench.library_l2", "bench_l2", "help", needs=("json", "no_such_module_for_ragcache"))
    message = missing_extra([absent, Benchmark("levels", "ragcache_bench.levels", "bench_levels", "help")])
    assert message is not None and message.startswith("l2 races the peer caches")
    assert "(missing: no_such_module_for_ragcache)" in message  # json is there: not named
    assert "ragcache[bench]" in message and "make bench" in message
    assert missing_extra([Benchmark("levels", "ragcache_bench.levels", "bench_levels", "help")]) is None
    assert BENCHMARKS["l2"].needs and BENCHMARKS["zipf"].needs  # the two that race LangChain and RedisVL


def test_counting_model_counts_every_text_a_peer_cache_computes_and_forwards_the_rest():
    from ragcache_bench.systems import CountingModel

    class Model:
        max_seq_length = 256

        def encode(self, sentences, **kwargs):
            return [len(text) for text in ([sentences] if isinstance(sentences, str) else sentences)]

    counting = CountingModel(Model())
    assert counting.encode(["a", "bb"], batch_size=32) == [1, 2]
    assert counting.encode("ccc") == [3]
    assert counting.num_texts == 3 and counting.max_seq_length == 256
