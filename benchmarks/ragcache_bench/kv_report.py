"""``bench kv``'s verdicts (per concurrency) and its Markdown tables."""

from __future__ import annotations

from typing import Any

from ragcache_bench.kv_blocks import LevelResult
from ragcache_bench.kv_workload import CACHING, CHURN
from ragcache_bench.report import BenchResult
from ragcache_bench.report import Target as Goal

__all__ = ["format_report", "verdicts"]


def verdicts(rows: list[LevelResult], prefix_tokens: int, concurrency: tuple[int, ...],
             warm_stats: dict[str, Any] | None = None) -> BenchResult:
    """The targets, per concurrency: caching on faster than off; keep-warm keeps >= 90% of the prefix cached
    under churn; keep-warm's TTFT p50 <= 1.05x no keep-warm's under the same churn. With an events configuration
    (``bench kv --events``, issue 30): it keeps >= 98% cached, its TTFT p50 <= 1.0x none, with <= 1/3 of the
    timer's warms."""
    result = BenchResult("kv", "TTFT and cached tokens: caching off/on, keep-warm under churn (alternating blocks)")
    by = {(r.configuration, r.concurrency): r for r in rows}
    for c in concurrency:
        off, on, churn, warm = (by.get((name, c)) for name in CACHING + CHURN)
        if off and on:
            result.add(f"TTFT p50 caching on / off, c={c}", _ratio(on.ttft_p50_ms, off.ttft_p50_ms), "x",
                       target=Goal("<=", 1.0), note=f"{on.ttft_p50_ms} vs {off.ttft_p50_ms} ms",
                       requires={"every stream carried a token": off.num_errors + on.num_errors == 0})
        if warm:
            share = round(100 * warm.cached_tokens_per_request / prefix_tokens, 1) if prefix_tokens else None
            result.add(f"cached tokens with keep-warm under churn, c={c}", share, "% of prefix",
                       target=Goal(">=", 90), note=f"{warm.cached_tokens_per_request} of {prefix_tokens} tokens; "
                       f"without keep-warm {churn.cached_tokens_per_request if churn else '-'}",
                       requires={"every stream carried a token": warm.num_errors == 0})
        if churn and warm:
            result.add(f"TTFT p50 keep-warm / none under churn, c={c}", _ratio(warm.ttft_p50_ms, churn.ttft_p50_ms),
                       "x", target=Goal("<=", 1.05),
                       note=f"p50 {warm.ttft_p50_ms} vs {churn.ttft_p50_ms} ms; p90 {warm.ttft_p90_ms} vs "
                       f"{churn.ttft_p90_ms} ms ({_ratio(warm.ttft_p90_ms, churn.ttft_p90_ms)}x)",
                       requires={"every stream carried a token": warm.num_errors + churn.num_errors == 0})
        events = by.get((f"{CHURN[1]} (events)", c))
        if events and churn:
            share = round(100 * events.cached_tokens_per_request / prefix_tokens, 1) if prefix_tokens else None
            result.add(f"cached tokens with event keep-warm under churn, c={c}", share, "% of prefix",
                       target=Goal(">=", 98), note=f"{events.cached_tokens_per_request} of {prefix_tokens} tokens",
                       requires={"every stream carried a token": events.num_errors == 0})
            result.add(f"TTFT p50 event keep-warm / none under churn, c={c}",
                       _ratio(events.ttft_p50_ms, churn.ttft_p50_ms), "x", target=Goal("<=", 1.0),
                       note=f"p50 {events.ttft_p50_ms} vs {churn.ttft_p50_ms} ms",
                       requires={"every stream carried a token": events.num_errors + churn.num_errors == 0})
    timer, by_events = (warm_stats or {}).get(CHURN[1]), (warm_stats or {}).get(f"{CHURN[1]} (events)")
    if timer and by_events:
        result.add("warms sent, events / timer", _ratio(by_events["num_warms_sent"], timer["num_warms_sent"]), "x",
                   target=Goal("<=", 0.334), note=f"{by_events['num_warms_sent']} vs {timer['num_warms_sent']} warms; "
                   f"{by_events.get('num_warms_avoided', 0)} due timer warms not sent (the events showed it whole)")
    if by_events and by_events.get("extras"):
        mine = by_events["prefix"]
        for name, chat in by_events["extras"].items():
            result.add(f"warms per eviction, chat prefix {name} (events)",
                       _ratio(chat["num_warms"], chat["num_evicted"]), "warms", target=Goal("<=", 1.5),
                       note=f"{chat['num_warms']} warms, {chat['num_evicted']} found it evicted, "
                       f"{chat['num_resident']} resident; completion prefix: {mine['num_warms']} warms, "
                       f"{mine['num_evicted']} evicted ({_ratio(mine['num_warms'], mine['num_evicted'])})",
                       requires={"an eviction was seen": chat["num_evicted"] > 0})
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def format_report(details: dict[str, Any]) -> str:
    """The two tables as Markdown (what benchmarks/notes/kv.md shows)."""
    config = details["config"]
    lines = [f"{details['label']}; shared system prompt {details['prefix_tokens']} tokens; "
             f"{config['max_tokens']} completion tokens per request; {config['rounds']} alternating blocks per "
             f"configuration and level; churn {details['churn_tokens_per_s_measured']} tokens/s "
             f"(the KV cache cycled every {details['kv_cache_cycle_s']} s)", "",
             "| configuration | concurrency | requests | errors | TTFT p50 ms | TTFT p90 ms | completion tokens/s "
             "| cached tokens/request (usage) | prefix-cache hit tokens (/metrics) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in details["rows"]:
        hits = "n/a" if r["vllm_hit_tokens"] is None else f"{r['vllm_hit_tokens']:,.0f}"
        lines.append(f"| {r['configuration']} | {r['concurrency']} | {r['num_requests']} | {r['num_errors']} | "
                     f"{r['ttft_p50_ms']} | {r['ttft_p90_ms']} | {r['tokens_per_s']} | "
                     f"{r['cached_tokens_per_request']} of {r['prompt_tokens_per_request']} | {hits} |")
    if details["rag"]:
        lines += ["", "| RAG assembly | requests | prompt tokens/request | cached tokens/request |", "|---|---|---|---|"]
        lines += [f"| {r['assembly']} | {r['num_requests']} | {r['prompt_tokens_per_request']} | "
                  f"{r['cached_tokens_per_request']} |" for r in details["rag"]]
        lines.append(f"\nassembled / naive cached tokens per request: {details['rag_ratio']}")
    return "\n".join(lines)
