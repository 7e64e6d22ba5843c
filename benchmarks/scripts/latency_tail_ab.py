"""A/B in one run: the latency tail of two source trees' services side by side (each its own process tree, the same
instant upstream, ``make serve``'s default levels), in alternating blocks of all-miss requests (8 clients x 32 new
texts, base64): p50, p99 and the slowest request of each (benchmarks/notes/r7.md: the cyclic collector's full
collections stop the event loop for as long as they scan). Run it from a folder that is not a checkout:

    git worktree add /tmp/base <rev>
    cd /tmp && AB_A=/tmp/base AB_B=/work/main /work/main/.venv/bin/python /work/main/benchmarks/scripts/latency_tail_ab.py
    # AB_BLOCKS=6; AB_REQUESTS=600 a block; writes /tmp/latency_tail_ab.json
    # AB_ENV_A / AB_ENV_B: JSON of settings for one side only, e.g. AB_ENV_B='{"RAGCACHE_MILVUS_URI": "off"}' with
    # AB_A=AB_B=/work/main puts a level's presence side by side instead of two trees (service_ab.start_services)

Both services are started as ``benchmarks/scripts/service_ab.py`` starts them (``start_services``: the *A* tree's launcher).
"""
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from service_ab import TREES, overhead, start_services  # noqa: E402 - this folder; it puts the A tree's benchmarks first

from ragcache_testing.instant import InstantUpstream  # noqa: E402

NUM_BLOCKS = int(os.environ.get("AB_BLOCKS", "6"))
NUM_REQUESTS = int(os.environ.get("AB_REQUESTS", "600"))
CLIENTS = 8


async def _latencies(url: str, bodies: list[dict]) -> list[float]:
    """Seconds of each request, ``CLIENTS`` at a time."""
    latencies: list[float] = []
    queue = iter(bodies)
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def worker() -> None:
            for body in queue:
                started = time.perf_counter()
                answer = await client.post("/embeddings", json=body)
                latencies.append(time.perf_counter() - started)
                answer.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(CLIENTS)))
    return latencies


def main() -> None:
    work = Path(tempfile.mkdtemp())
    with InstantUpstream() as upstream:
        services = start_services(upstream, work, "default")
        texts = overhead._Texts()
        samples: dict[str, list[float]] = {name: [] for name in services}
        try:
            for service in services.values():
                asyncio.run(_latencies(service.url + "/v1", texts.bodies(50, upstream.model, "base64")))  # warm
            for _ in range(NUM_BLOCKS):
                for name, service in services.items():
                    samples[name] += asyncio.run(_latencies(service.url + "/v1", texts.bodies(NUM_REQUESTS, upstream.model, "base64")))
        finally:
            for service in services.values():
                service.stop()
    figures = {}
    for name, values in samples.items():
        ordered = sorted(values)
        figures[name] = {"tree": TREES[name], "env": os.environ.get(f"AB_ENV_{name}", "{}"), "requests": len(ordered),
                         "p50_ms": 1000 * statistics.median(ordered),
                         "p99_ms": 1000 * ordered[int(0.99 * len(ordered))], "max_ms": 1000 * ordered[-1],
                         "over_100_ms": sum(value > 0.1 for value in ordered)}
        print(name, json.dumps(figures[name]))
    Path("/tmp/latency_tail_ab.json").write_text(json.dumps({"load": os.getloadavg(), "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
