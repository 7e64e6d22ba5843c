"""The cold path through the service: a Zipf stream of short passages that starts with every level empty.

ragcache (HTTP, one worker, L1 + the disk level + L2 on the bench's Redis + L3 on its own Milvus Lite) against the
floor a team would write instead of a cache service: per request one MGET, encode the misses with the same model
and batch size, and pipelined SETs of the new vectors. Both see the same requests in the same order and compute the
same distinct texts; a cache must not make that path slower.

Side by side in time: the stream is cut into blocks of ``BLOCK`` requests, and each block runs through both
systems before the next one starts (the floor first in even blocks, the service first in odd ones). Each system
keeps its own state from block to block (the floor its own key prefix in Redis; the service its process, its L1
and its L3), so each sees one cold stream; what the machine's speed does over a minute is shared by both instead
of landing on whichever ran in a slow moment (whole rounds one after the other differed by up to 20% in model
time alone). Both models are warm first: ``WARM_UP`` requests of passages the stream never asks for go through
each (untimed), since a model's first batches in a new process are slower (1.47x in the first block of a run
without it) and the floor's model had already run the bench's earlier work. A service block's time ends when
its last write is stored, not at its last response: the floor's SETs are inside its timer, so the service's
L2 and L3 writes (its write-behind gathers L3's for ``l3_write_linger_ms``, one Milvus call for several
requests) are inside its own, as the CPU its process tree spends storing them (the wall time of that wait is
mostly the linger, idle). The writes still owed at the last response are reported beside.

Both systems compute the same distinct texts with the same model, so the service cannot honestly be much faster
than the floor: a ratio above ``MAX_PLAUSIBLE`` means the machine's load moved between the two, and the run is a
MISS ("noisy run"), never a PASS.
"""

from __future__ import annotations

import time

import numpy as np
import orjson

from ragcache.storage.processes import poll_until
from ragcache_bench.context import BATCH_SIZE, BenchContext
from ragcache_bench.overhead import process_tree_cpu_s
from ragcache_bench.report import BenchResult, Target, median, plausible
from ragcache_bench.systems import BareModel
from ragcache_testing.service import ServiceProcess, served

__all__ = ["bench_cold"]

BLOCK = 10  # requests per block: 64 pairs in a full run (20,480 texts), 3 in a quick one
WARM_UP = 8  # requests of unseen passages through each system before the stream
# Most the service can be faster than the floor computing the same texts before the figure says more about the
# machine's load than about the cache (a quick run on a loaded machine once read 1.87x).
MAX_PLAUSIBLE = 1.1


def bench_cold(ctx: BenchContext) -> BenchResult:
    result = BenchResult("cold", "cold Zipf stream through the service vs MGET + encode misses + SET")
    num_batches = ctx.sizes.cold_batches
    batches = [ctx.batch(i) for i in range(num_batches)]
    distinct = len({text for batch in batches for text in batch})
    texts = sum(len(batch) for batch in batches)
    ctx.redis_client.flushdb()
    floor = _Floor(ctx)
    service = _Service(ctx)
    warm_up = ctx.unseen_texts(WARM_UP * BATCH_SIZE)
    warm_up_batches = [warm_up[start : start + BATCH_SIZE] for start in range(0, len(warm_up), BATCH_SIZE)]
    for system in (floor, service):
        system.run(warm_up_batches)
    floor.num_computed = 0
    service.restart_counts()
    blocks: list[dict] = []
    try:
        for start in range(0, num_batches, BLOCK):
            block = batches[start : start + BLOCK]
            order: list[_Floor | _Service] = [floor, service] if (start // BLOCK) % 2 == 0 else [service, floor]
            blocks.append({system.name: system.run(block) for system in order})
        totals = {name: _totals([b[name] for b in blocks]) for name in ("floor", "ragcache")}
        totals["ragcache"].update(computed=service.computed(), max_pending_writes=max(b["ragcache"]["pending_writes"] for b in blocks))
    finally:
        service.stop()
    floor_rate = texts / totals["floor"]["seconds"]
    cache_rate = texts / totals["ragcache"]["seconds"]
    block_ratios = [b["floor"]["seconds"] / b["ragcache"]["seconds"] for b in blocks]
    result.add("floor: MGET + encode misses + SET", floor_rate, "texts/s",
               note=f"{num_batches} requests of {BATCH_SIZE}, {distinct} distinct")
    result.add("ragcache service, L1+disk+L2+L3", cache_rate, "texts/s",
               note=f"writes pending at a block's last response (stored inside the block's time): at most "
               f"{totals['ragcache']['max_pending_writes']}")
    # Where the time goes: the model's own seconds (the floor's encode calls; the service's compute_s from
    # /stats) and what is left per request outside the model (lookups, writes, HTTP for the service).
    for name in ("floor", "ragcache"):
        outside_ms = (totals[name]["seconds"] - totals[name]["model_s"]) / num_batches * 1000
        result.add(f"{name}: model time", totals[name]["model_s"], "s", note=f"outside the model: {outside_ms:.2f} ms a request")
    ratio = cache_rate / floor_rate
    result.add("ragcache / floor", ratio, "x", target=Target(">=", 0.9), goal="28.5",
               note=f"issue 22.4 asked 0.95x, issue 28.5 0.9x with every level on; {len(blocks)} blocks of {BLOCK} requests, "
               "each through both (alternating which first), the service's "
               f"writes inside its time; per block {min(block_ratios):.2f}..{max(block_ratios):.2f}x, median {median(block_ratios):.2f}x",
               requires={
                   "each system computed each distinct text once": floor.num_computed == distinct
                   and totals["ragcache"]["computed"] == distinct,
                   **plausible(ratio, MAX_PLAUSIBLE),
               })
    result.details = {"blocks": blocks, "totals": totals, "distinct": distinct, "texts": texts, "block_size": BLOCK,
                      "block_ratios": block_ratios}
    return result


def _totals(runs: list[dict]) -> dict:
    return {"seconds": sum(r["seconds"] for r in runs), "model_s": sum(r["model_s"] for r in runs)}


class _Floor:
    """One MGET per request, the misses encoded in one model call, one pipeline of SETs (raw float32)."""

    name = "floor"

    def __init__(self, ctx: BenchContext):
        self.client = ctx.redis_client
        self.model = BareModel(ctx.model)
        self.space = ctx.encoder.space
        self.num_computed = 0

    def run(self, batches: list[list[str]]) -> dict:
        model_s = 0.0
        started = time.perf_counter()
        for batch in batches:
            keys = ["floor:" + key for key in self.space.keys(batch)]
            values = self.client.mget(keys)
            missing = [i for i, value in enumerate(values) if value is None]
            if missing:
                # Duplicates inside a request are computed once, as any cache would.
                new_texts = list(dict.fromkeys(batch[i] for i in missing))
                model_started = time.perf_counter()
                vectors = self.model.embed(new_texts)
                model_s += time.perf_counter() - model_started
                self.num_computed += len(new_texts)
                row_of = {text: row for row, text in enumerate(new_texts)}
                pipe = self.client.pipeline(transaction=False)
                for i in missing:
                    pipe.set(keys[i], vectors[row_of[batch[i]]].tobytes())
                pipe.execute()
            found = [np.frombuffer(value, dtype=np.float32) for value in values if value is not None]
            del found
        return {"seconds": time.perf_counter() - started, "model_s": model_s}


class _Service:
    """The service, started once with empty levels; each block's requests one after the other."""

    name = "ragcache"

    def __init__(self, ctx: BenchContext):
        # Every level on, as `ragcache serve` has them: the disk level in its data folder, L2, L3 (Milvus Lite).
        self.process = ServiceProcess(ctx.workdir / "cold", redis_url=ctx.redis_url,
                                      extra_env={"RAGCACHE_DISK_PATH": str(ctx.workdir / "cold" / "disk")})
        self._model_s_seen = 0.0
        self.restart_counts()

    def restart_counts(self) -> None:
        """Count computations and model time from now on (after a warm-up)."""
        self._wait_for_writes()
        stats = self._stats()
        self._computed_before, self._model_s_seen = _texts_computed(stats), _compute_s(stats)

    def run(self, batches: list[list[str]]) -> dict:
        headers = {"content-type": "application/json"}
        bodies = [orjson.dumps({"inputs": batch, "normalize": False}) for batch in batches]
        inputs_computed = 0
        started = time.perf_counter()
        for body in bodies:
            response = self.process.client.post("/embed", content=body, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"/embed -> {response.status_code}: {response.text[:300]}")
            inputs_computed += served(response)["Compute"]  # a text twice in one request counts twice here
        to_last_response_s = time.perf_counter() - started
        stats = self._stats()
        pending = _pending_writes(stats)
        # The writes still owed are stored before the other system's block starts (their work must not land in its
        # time), and their cost is counted in this block's: the CPU the service's process tree spends meanwhile.
        # Not the wall time: most of it is L3's write-behind lingering (l3_write_linger_ms) to gather a stream's
        # writes into one Milvus call, idle time that a continuous stream overlaps with its next requests.
        cpu_before = process_tree_cpu_s(self.process.process.pid)
        self._wait_for_writes()
        writes_s = process_tree_cpu_s(self.process.process.pid) - cpu_before
        seconds = to_last_response_s + writes_s  # the block's writes inside its time, as the floor's SETs are
        model_s_now = _compute_s(self._stats())
        model_s, self._model_s_seen = model_s_now - self._model_s_seen, model_s_now
        return {"seconds": seconds, "to_last_response_s": to_last_response_s, "writes_cpu_s": writes_s, "model_s": model_s,
                "inputs_served_by_compute": inputs_computed, "pending_writes": pending}

    def computed(self) -> int:
        return _texts_computed(self._stats()) - self._computed_before

    def _stats(self) -> dict:
        return self.process.client.get("/stats").json()

    def _wait_for_writes(self, timeout_s: float = 60.0) -> None:
        # Every 50 ms: each look costs the service a /stats answer, which is counted as the writes' cost.
        if not poll_until(lambda: not _pending_writes(self._stats()), timeout_s=timeout_s, interval_s=0.05):
            raise RuntimeError(f"the service still owed L2/L3 writes after {timeout_s:.0f} s")

    def stop(self) -> None:
        self.process.stop()


def _texts_computed(stats: dict) -> int:
    """Distinct texts the service's caches computed since start (each counted once per computation)."""
    return sum(model["since_start"]["texts_computed"] for model in stats["models"].values())


def _compute_s(stats: dict) -> float:
    """Seconds the service's models spent computing since start (inside the model call)."""
    return sum(model["since_start"]["compute_s"] for model in stats["models"].values())


def _pending_writes(stats: dict) -> int:
    """Writes the service's caches still owed L2/L3 when /stats answered."""
    return sum(model["pending_writes"] for model in stats["models"].values())
