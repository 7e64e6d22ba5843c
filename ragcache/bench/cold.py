"""The cold path through the service: a Zipf stream of short passages that starts with every level empty.

ragcache (HTTP, one worker, L1 + L2 on the bench's Redis + L3 on its own Milvus Lite) against the floor a
team would write instead of a cache service: per request one MGET, encode the misses with the same model
and batch size, and pipelined SETs of the new vectors. Both see the same requests in the same order and
compute the same distinct texts; a cache must not make that path slower.

Rounds run one after the other in ABBA order (floor, ragcache, ragcache, floor in a full run), each from
empty levels: a new key prefix for the floor, a new service process (new L1, new L3 folder) and a flushed
Redis for ragcache. The service's time ends at its last response; the writes it still owes L3 then are
reported beside it (``pending_writes`` from /stats), never hidden.
"""

from __future__ import annotations

import time

import numpy as np
import orjson

from ragcache.bench.context import BATCH_SIZE, BenchContext
from ragcache.bench.report import BenchResult, Target, median
from ragcache.bench.service import ServiceProcess, served
from ragcache.bench.systems import BareModel

__all__ = ["bench_cold"]


def bench_cold(ctx: BenchContext) -> BenchResult:
    result = BenchResult("cold", "cold Zipf stream through the service vs MGET + encode misses + SET")
    num_batches = ctx.sizes.race_batches
    batches = [ctx.batch(i) for i in range(num_batches)]
    distinct = len({text for batch in batches for text in batch})
    order = ["floor", "ragcache"] if ctx.quick else ["floor", "ragcache", "ragcache", "floor"]
    rounds: dict[str, list[dict]] = {"floor": [], "ragcache": []}
    for index, system in enumerate(order):
        run = _floor_round if system == "floor" else _service_round
        rounds[system].append(run(ctx, batches, round_index=index))
    floor_rate = median([r["texts_per_s"] for r in rounds["floor"]])
    cache_rate = median([r["texts_per_s"] for r in rounds["ragcache"]])
    texts = sum(len(batch) for batch in batches)
    result.add("floor: MGET + encode misses + SET", floor_rate, "texts/s",
               note=f"{num_batches} requests of {BATCH_SIZE}, {distinct} distinct")
    result.add("ragcache service, L1+L2+L3", cache_rate, "texts/s",
               note=f"L3 writes still pending at the last response: {[r['pending_writes'] for r in rounds['ragcache']]}")
    # Where the time goes: the model's own seconds (the floor's encode calls; the service's compute_s from
    # /stats) and what is left per request outside the model (lookups, writes, HTTP for the service).
    for system, label in (("floor", "floor"), ("ragcache", "ragcache")):
        model_s = median([r["model_s"] for r in rounds[system]])
        outside_ms = median([(r["seconds"] - r["model_s"]) / num_batches * 1000 for r in rounds[system]])
        result.add(f"{label}: model time", model_s, "s", note=f"outside the model: {outside_ms:.2f} ms a request")
    result.add("ragcache / floor", cache_rate / floor_rate, "x", target=Target(">=", 0.95), goal="1",
               note=f"rounds in order {' '.join(order)}; {texts} texts each",
               requires={
                   "each system computed each distinct text once": all(r["computed"] == distinct for rs in rounds.values() for r in rs),
               })
    result.details = {"order": order, "rounds": rounds, "distinct": distinct, "texts": texts}
    return result


def _floor_round(ctx: BenchContext, batches: list[list[str]], *, round_index: int) -> dict:
    """One MGET per request, the misses encoded in one model call, one pipeline of SETs (raw float32)."""
    client = ctx.redis_client
    client.flushdb()
    model = BareModel(ctx.model)
    prefix = f"floor{round_index}:"
    space = ctx.encoder.space
    computed = 0
    model_s = 0.0
    started = time.perf_counter()
    for batch in batches:
        keys = [prefix + key for key in space.keys(batch)]
        values = client.mget(keys)
        missing = [i for i, value in enumerate(values) if value is None]
        if missing:
            # Duplicates inside a request are computed once, as any cache would.
            new_texts = list(dict.fromkeys(batch[i] for i in missing))
            model_started = time.perf_counter()
            vectors = model.embed(new_texts)
            model_s += time.perf_counter() - model_started
            computed += len(new_texts)
            row_of = {text: row for row, text in enumerate(new_texts)}
            pipe = client.pipeline(transaction=False)
            for i in missing:
                pipe.set(keys[i], vectors[row_of[batch[i]]].tobytes())
            pipe.execute()
        found = [np.frombuffer(value, dtype=np.float32) for value in values if value is not None]
        del found
    seconds = time.perf_counter() - started
    texts = sum(len(batch) for batch in batches)
    return {"texts_per_s": texts / seconds, "seconds": seconds, "computed": computed, "model_s": model_s}


def _service_round(ctx: BenchContext, batches: list[list[str]], *, round_index: int) -> dict:
    ctx.redis_client.flushdb()
    service = ServiceProcess(ctx.workdir / f"cold-{round_index}", redis_url=ctx.redis_url)
    try:
        service.post("/embed", {"inputs": ["warm-up: the first request loads what the first request loads"]})
        headers = {"content-type": "application/json"}
        bodies = [orjson.dumps({"inputs": batch, "normalize": False}) for batch in batches]
        before = service.client.get("/stats").json()
        computed_before, model_s_before = _texts_computed(before), _compute_s(before)
        inputs_computed = 0
        started = time.perf_counter()
        for body in bodies:
            response = service.client.post("/embed", content=body, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"/embed -> {response.status_code}: {response.text[:300]}")
            inputs_computed += served(response)["Compute"]  # a text twice in one request counts twice here
        seconds = time.perf_counter() - started
        stats = service.client.get("/stats").json()
    finally:
        service.stop()
    texts = sum(len(batch) for batch in batches)
    return {"texts_per_s": texts / seconds, "seconds": seconds, "computed": _texts_computed(stats) - computed_before,
            "inputs_served_by_compute": inputs_computed, "pending_writes": _pending_writes(stats),
            "model_s": _compute_s(stats) - model_s_before}


def _texts_computed(stats: dict) -> int:
    """Distinct texts the service's caches computed since start (each counted once per computation)."""
    return sum(model["since_start"]["texts_computed"] for model in stats["models"].values())


def _compute_s(stats: dict) -> float:
    """Seconds the service's models spent computing since start (inside the model call)."""
    return sum(model["since_start"]["compute_s"] for model in stats["models"].values())


def _pending_writes(stats: dict) -> int:
    """Writes the service's caches still owed L2/L3 when /stats answered."""
    return sum(model["pending_writes"] for model in stats["models"].values())
