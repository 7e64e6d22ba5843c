"""``bench kv``'s RAG assembly: the same retrieved-chunk requests assembled naively and by
:func:`ragcache.prefixes.assemble_prompt`, and the prompt tokens each gets from the prefix cache."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

import httpx

from ragcache.prefixes import Target, assemble_prompt
from ragcache_bench.kv_workload import WORDS, KVConfig

__all__ = ["RagResult", "naive_prompt", "rag_ratio", "rag_requests", "run_rag"]


@dataclass(frozen=True)
class RagResult:
    """Cached prompt tokens per request of one assembly over the same RAG requests."""

    assembly: str
    num_requests: int
    prompt_tokens_per_request: float
    cached_tokens_per_request: float


@dataclass(frozen=True)
class _Chunk:
    id: str
    text: str


def rag_requests(config: KVConfig, num_requests: int, num_chunks: int, k: int, zipf_s: float,
                 chunk_words: int = 120) -> list[tuple[list[_Chunk], str]]:
    """(chunks in score order, question) per request: chunks drawn by Zipf popularity, ids shuffled so that
    id order says nothing about popularity."""
    rng = random.Random(config.seed + 7)
    ids = [f"doc-{i:04d}" for i in range(num_chunks)]
    rng.shuffle(ids)  # ids[rank] is the rank-th most popular chunk
    corpus = [_Chunk(doc_id, " ".join(rng.choice(WORDS) for _ in range(chunk_words)) + ".") for doc_id in ids]
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(num_chunks)]
    out = []
    for i in range(num_requests):
        picked: dict[str, _Chunk] = {}
        while len(picked) < k:
            chunk = rng.choices(corpus, weights)[0]
            picked.setdefault(chunk.id, chunk)
        out.append((list(picked.values()), f"Question {i}: what does the {rng.choice(WORDS)} do?\n"))
    return out


def naive_prompt(system: str, chunks: list[_Chunk], question: str, timestamp: str) -> str:
    """What many RAG apps send: the date inside the system prompt, chunks in score order."""
    return f"{system}Current time: {timestamp}\n" + "".join(f"[{c.id}] {c.text}\n" for c in chunks) + question


def run_rag(target: Target, system: str, config: KVConfig, *, http: httpx.Client, num_requests: int,
            num_chunks: int, k: int, zipf_s: float) -> list[RagResult]:
    """The same RAG requests, assembled naively and by :func:`assemble_prompt`, one at a time."""
    requests = rag_requests(config, num_requests, num_chunks, k, zipf_s)
    results = []
    for assembly in ("naive", "assembled"):
        usages = []
        for i, (chunks, question) in enumerate(requests):
            timestamp = f"2026-12-01T05:{i // 60:02d}:{i % 60:02d}Z"  # one request a second
            prompt = (naive_prompt(system, chunks, question, timestamp) if assembly == "naive" else
                      assemble_prompt(system, chunks, f"Current time: {timestamp}\n{question}"))
            # A salt per assembly: the second run cannot reuse blocks the first one left behind.
            r = http.post(f"{target.base_url}/v1/completions",
                          json={"model": target.model, "prompt": prompt, "max_tokens": 1, "cache_salt": assembly})
            r.raise_for_status()
            usages.append(r.json()["usage"])
        results.append(RagResult(
            assembly, len(usages), round(statistics.fmean(u["prompt_tokens"] for u in usages), 1),
            round(statistics.fmean((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                                   for u in usages), 1)))
    return results


def rag_ratio(rag: list[RagResult]) -> float | None:
    by_name = {r.assembly: r.cached_tokens_per_request for r in rag}
    if not by_name.get("naive"):
        return None
    return round(by_name["assembled"] / by_name["naive"], 2)
