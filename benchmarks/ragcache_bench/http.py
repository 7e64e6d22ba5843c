"""Benchmarks of the HTTP service (``ragcache serve``, one worker), driven over loopback by httpx.

One service process is shared by the HTTP benchmarks of a run; its L2 is the bench's Redis, so vectors
the bench already holds (the real model's) can be made resident without the server computing them again.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import orjson
import torch

from ragcache_bench.context import BATCH_SIZE, BenchContext
from ragcache_bench.corpus import corpus_chunks
from ragcache_bench.http_floor import BareClient
from ragcache_bench.loadgen import run_load
from ragcache_bench.report import BenchResult, Target, interleaved, median
from ragcache_bench.systems import BareModel
from ragcache_testing.service import ServiceProcess, served

__all__ = ["bench_http", "bench_search"]

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
CONCURRENCY = 8
LOAD_BLOCKS = 3  # parts of each load run, with a bare-model block between them


def _service(ctx: BenchContext) -> ServiceProcess:
    if ctx.service is None:
        ctx.service = ServiceProcess(ctx.workdir, redis_url=ctx.redis_url)
    return ctx.service


def _seed_l2(ctx: BenchContext, texts: list[str], vectors: np.ndarray) -> None:
    """Make vectors resident in the service's L2 (same Redis, same space, so the same keys)."""
    from ragcache.tiers.redis import RedisTier

    tier = RedisTier(ctx.redis_client, dim=ctx.encoder.dim, dtype=torch.float32, ttl_s=ctx.settings.levels.redis_ttl_s)
    keys = ctx.encoder.space.keys(texts)
    for start in range(0, len(keys), 5000):
        tier.put_many(keys[start : start + 5000], torch.from_numpy(np.ascontiguousarray(vectors[start : start + 5000])))


# ---- targets 1 and 2 -----------------------------------------------------------------------------------------


def bench_http(ctx: BenchContext) -> BenchResult:
    result = BenchResult("http", "the service over loopback HTTP (1 worker)")
    service = _service(ctx)
    _latency(ctx, service, result)
    _hot_floor(ctx, service, result)
    _throughput(ctx, service, result)
    return result


def _hot_floor(ctx: BenchContext, service: ServiceProcess, result: BenchResult) -> None:
    """A 32-text request answered from L1 against the floor: a route of the same server process that returns
    the same response bytes precomputed (benchmarks/ragcache_bench/floor_app.py). Interleaved, medians; JSON and base64."""
    from ragcache_bench.floor_app import FLOOR_PATH

    texts = ctx.unseen_texts(BATCH_SIZE, skip=5200)
    shapes: dict[str, tuple[str, dict[str, Any]]] = {
        "/embed JSON": ("/embed", {"inputs": texts, "normalize": False}),
        "/v1/embeddings base64": ("/v1/embeddings", {"input": texts, "model": MODEL, "encoding_format": "base64"}),
    }
    client = service.client
    repeats = 60 if ctx.quick else 200
    details = {}
    headers = {"content-type": "application/json"}
    for name, (path, body) in shapes.items():
        content = orjson.dumps(body)
        service.post(path, body)  # computed once: every later answer comes from L1
        answer = client.post(path, content=content, headers=headers)
        client.put(FLOOR_PATH, content=answer.content)
        from_l1 = served(answer)["L1"] == BATCH_SIZE
        def cache_call(path: str = path, content: bytes = content) -> object:
            return client.post(path, content=content, headers=headers)

        def floor_call(content: bytes = content) -> object:
            return client.post(FLOOR_PATH, content=content, headers=headers)

        samples = interleaved(
            {"cache": cache_call, "floor": floor_call},
            repeats=repeats,
            warmup=10,
        )
        same_bytes = client.post(FLOOR_PATH, content=content, headers=headers).content == answer.content
        cache_ms, floor_ms = median(samples["cache"]) * 1000, median(samples["floor"]) * 1000
        result.add(f"{name} from L1 / floor (same bytes, same process)", cache_ms / floor_ms, "x",
                   target=Target("<=", 2.0), goal="4",
                   note=f"p50 {cache_ms:.2f} ms vs {floor_ms:.2f} ms; {len(answer.content):,} response bytes",
                   requires={"every text from L1": from_l1, "the floor answered the same bytes": same_bytes})
        details[name] = {"cache_ms": cache_ms, "floor_ms": floor_ms, "response_bytes": len(answer.content)}
    result.details["hot_floor"] = details


def _latency(ctx: BenchContext, service: ServiceProcess, result: BenchResult) -> None:
    """A 32-text /embed: first (computed: every level misses) and again (L1), same body, side by side."""
    repeats = ctx.sizes.repeats
    texts = ctx.unseen_texts(repeats * BATCH_SIZE, skip=4000)
    cold, hot, served_cold, served_hot = [], [], [], []
    service.post("/embed", {"inputs": ctx.unseen_texts(BATCH_SIZE, skip=5000), "normalize": False})  # warm-up
    for r in range(repeats):
        body = {"inputs": texts[r * BATCH_SIZE : (r + 1) * BATCH_SIZE], "normalize": False}
        started = time.perf_counter()
        response = service.post("/embed", body)
        cold.append(time.perf_counter() - started)
        served_cold.append(served(response))
        samples = []
        for _ in range(7):
            started = time.perf_counter()
            response = service.post("/embed", body)
            samples.append(time.perf_counter() - started)
        hot.append(median(samples))
        served_hot.append(served(response))
    all_computed = all(s["Compute"] == BATCH_SIZE for s in served_cold)
    all_l1 = all(s["L1"] == BATCH_SIZE for s in served_hot)
    result.add("/embed 32 texts, computed", median(cold) * 1000, "ms", note=f"every text computed: {all_computed}")
    result.add("/embed 32 texts, from L1", median(hot) * 1000, "ms", note=f"every text from L1: {all_l1}")
    result.add("/embed computed / L1", median(cold) / median(hot), "x", target=Target(">=", 100), goal="1",
               note=f"median of {repeats} new batches; L1 = median of 7 repeats each",
               requires={"every cold text computed": all_computed, "every hot text from L1": all_l1})
    result.details["latency"] = {"cold_ms": [c * 1000 for c in cold], "hot_ms": [h * 1000 for h in hot],
                                 "served_cold": served_cold, "served_hot": served_hot}


def _throughput(ctx: BenchContext, service: ServiceProcess, result: BenchResult) -> None:
    """8 concurrent clients, requests of 32 texts that all hit L1, against the bare model's texts/s."""
    batches = [ctx.batch(i) for i in range(ctx.sizes.race_batches)]
    distinct = list(dict.fromkeys(t for b in batches for t in b))
    _seed_l2(ctx, distinct, ctx.vectors(distinct))
    for batch in batches:  # L2 -> L1
        service.post("/embed", {"inputs": batch, "normalize": False})
    check = served(service.post("/embed", {"inputs": batches[-1], "normalize": False}))
    shapes = {
        "/embed (JSON floats)": ("/embed", lambda b: {"inputs": b, "normalize": False}),
        "/v1/embeddings float": ("/v1/embeddings", lambda b: {"input": b, "model": MODEL, "encoding_format": "float"}),
        "/v1/embeddings base64": ("/v1/embeddings", lambda b: {"input": b, "model": MODEL, "encoding_format": "base64"}),
    }
    bare = BareModel(ctx.model)
    bare_batches = batches[: ctx.sizes.bare_batches]

    def bare_block() -> float:
        started = time.perf_counter()
        for batch in bare_batches:
            bare.embed(batch)
        return time.perf_counter() - started

    # Interleaved: each shape's load runs in LOAD_BLOCKS parts, a block of the bare model before each part and
    # one after the last, so the model is timed under the same drift of the machine as the load it is weighed
    # against (not once before all loads and once after).
    loads: dict[str, list] = {}
    bare_s: dict[str, list[float]] = {}
    for name, (path, make) in shapes.items():
        bodies = [orjson.dumps(make(b)) for b in batches]
        bare_s[name] = [bare_block()]
        loads[name] = []
        for _ in range(LOAD_BLOCKS):
            loads[name].append(run_load(service.url, path, bodies, BATCH_SIZE, concurrency=CONCURRENCY,
                                        seconds=ctx.sizes.http_seconds / LOAD_BLOCKS))
            bare_s[name].append(bare_block())
    bare_texts = len(bare_batches) * BATCH_SIZE
    all_bare = [bare_texts / seconds for blocks in bare_s.values() for seconds in blocks]
    result.add("bare model, requests of 32", median(all_bare), "texts/s",
               note=f"{len(all_bare)} blocks of {len(bare_batches)} requests between the load's parts: "
               f"{min(all_bare):.1f}-{max(all_bare):.1f}")
    for name, parts in loads.items():
        num_texts, seconds = sum(p.num_texts for p in parts), sum(p.seconds for p in parts)
        num_from_l1 = sum(p.num_from_l1 for p in parts)
        latencies = [latency for p in parts for latency in p.latencies_s]
        bare_rate = bare_texts * len(bare_s[name]) / sum(bare_s[name])
        result.add(f"{name}, 8 clients, all L1", num_texts / seconds, "texts/s",
                   note=f"{sum(p.num_requests for p in parts) / seconds:.0f} req/s, p50 {median(latencies) * 1000:.1f} ms, "
                   f"{sum(p.response_bytes for p in parts) / max(sum(p.num_requests for p in parts), 1) / 1024:.0f} KiB/response")
        result.add(f"{name} / bare model", num_texts / seconds / bare_rate, "x", target=Target(">=", 70), goal="2",
                   note=f"against the bare model's {bare_rate:.1f} texts/s in the blocks around this load; "
                   f"{num_from_l1:,} of {num_texts:,} texts from L1",
                   requires={"every text of the load from L1": num_from_l1 == num_texts})
    result.details["throughput"] = {
        "bare_block_s": bare_s,
        "bare_batches_per_block": len(bare_batches),
        "requests_in_cycle": len(batches),
        "served_check": check,
        "loads": {name: [{"texts_per_s": run.texts_per_s, "requests": run.num_requests, "seconds": run.seconds,
                          "from_l1": run.num_from_l1, "p50_ms": median(run.latencies_s) * 1000,
                          "p99_ms": float(np.percentile(run.latencies_s, 99)) * 1000} for run in parts]
                  for name, parts in loads.items()},
    }


# ---- target 8 -----------------------------------------------------------------------------------------------


def bench_search(ctx: BenchContext) -> BenchResult:
    """/search over 100k documents: the first query for a text, then the same query again (result cache)."""
    result = BenchResult("search", f"/search over {ctx.sizes.search_documents:,} documents")
    service = _service(ctx)
    collection = "bench_docs"
    documents = corpus_chunks(ctx.corpus, ctx.sizes.search_documents)
    # Document vectors: random unit vectors made resident in L2 under the documents' real keys. Computing
    # 100k real embeddings would take the model 10+ minutes here; a search's cost does not depend on the
    # values of the vectors searched, and every query's embedding is the real model's.
    rng = np.random.default_rng(ctx.seed)
    vectors = rng.standard_normal((len(documents), ctx.encoder.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    started = time.perf_counter()
    _seed_l2(ctx, documents, vectors)
    computed = 0
    step = 2000
    for start in range(0, len(documents), step):
        body: dict[str, Any] = {"collection": collection,
                "documents": [{"id": f"d{start + i}", "text": text, "metadata": {"n": start + i}}
                              for i, text in enumerate(documents[start : start + step])]}
        computed += service.post("/documents", body).json()["num_computed"]
    ingest_s = time.perf_counter() - started

    queries = ctx.unseen_texts(ctx.sizes.search_queries, skip=6000)
    service.post("/search", {"query": ctx.unseen_texts(1, skip=7000)[0], "collection": collection, "top_k": 10})  # warm-up
    # The timed requests go through the least client there is (one kept-alive socket, httptools' parser): what is
    # measured is the service; httpx's own 0.3-0.5 ms a request is reported beside, on the repeats.
    client = BareClient("127.0.0.1", service.port)
    first, repeat, repeat_httpx, embed_ms, search_ms, outcomes, repeat_server_ms = [], [], [], [], [], [], []
    for query in queries:
        body = {"query": query, "collection": collection, "top_k": 10}
        content = orjson.dumps(body)
        t0 = time.perf_counter()
        answer = orjson.loads(client.post("/search", content))
        first.append(time.perf_counter() - t0)
        embed_ms.append(answer["timings_ms"]["embed"])
        search_ms.append(answer["timings_ms"]["search"])
        samples, server_ms, samples_httpx = [], [], []
        for _ in range(5):
            t0 = time.perf_counter()
            again = orjson.loads(client.post("/search", content))
            samples.append(time.perf_counter() - t0)
            server_ms.append(again["timings_ms"]["total"])
            t0 = time.perf_counter()
            service.post("/search", body).json()
            samples_httpx.append(time.perf_counter() - t0)
        repeat.append(median(samples))
        repeat_httpx.append(median(samples_httpx))
        repeat_server_ms.append(median(server_ms))
        outcomes.append((answer.get("embedding_level"), answer.get("result_cache"), again.get("result_cache"), len(again["hits"])))
    client.close()
    result.add("first query (computed embedding + Milvus)", median(first) * 1000, "ms",
               note=f"server: embed {median(embed_ms):.1f} ms + search {median(search_ms):.1f} ms")
    result.add("first query: embedding", median(embed_ms), "ms", note=f"query embedding from {outcomes[0][0]}")
    result.add("first query: Milvus search", median(search_ms), "ms", note="top-10, AUTOINDEX, Milvus Lite")
    result.add("repeated query (result cache)", median(repeat) * 1000, "ms",
               note=f"result cache: {outcomes[0][2]}; {median(repeat_server_ms):.2f} ms of it inside the knowledge base")
    result.add("repeated query, sent with httpx", median(repeat_httpx) * 1000, "ms",
               note=f"first / repeated with httpx's cost on the repeat: {median(first) / median(repeat_httpx):.1f}x")
    result.add("first / repeated", median(first) / median(repeat), "x", target=Target(">=", 20), goal="8, 28.5",
               note=f"{len(queries)} queries; HTTP round trip included on both sides (a bare client)",
               requires={"every first query missed the result cache": all(o[1] == "miss" for o in outcomes),
                         "every repeat hit the result cache": all(o[2] == "hit" for o in outcomes)})
    result.add("ingest (vectors from L2)", len(documents) / ingest_s, "docs/s", note=f"{computed} embeddings computed")
    result.details = {"documents": len(documents), "ingest_s": ingest_s, "first_ms": [f * 1000 for f in first],
                      "repeat_ms": [r * 1000 for r in repeat], "repeat_httpx_ms": [r * 1000 for r in repeat_httpx],
                      "repeat_server_ms": repeat_server_ms,
                      "server_embed_ms": embed_ms, "server_search_ms": search_ms,
                      "outcomes": outcomes,
                      "note": "document vectors are seeded random unit vectors (see bench_search); queries use the real model"}
    return result
