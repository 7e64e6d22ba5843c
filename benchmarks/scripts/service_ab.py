"""A/B in one run: the service of two source trees side by side (each its own process tree, embedded Redis, the
same instant upstream), in alternating blocks of all-miss requests (8 clients x 32 new texts, base64) and of L1
hits; CPU ms per text of each service's process tree and texts/s against straight to the upstream (benchmarks/notes/r5.md).
Run it from a folder that is not a checkout (``-c`` puts the working folder first on sys.path):

    git worktree add /tmp/base <rev>
    cd /tmp && AB_A=/tmp/base AB_B=/work/main /work/main/.venv/bin/python /work/main/benchmarks/scripts/service_ab.py
    # AB_CONFIG=l2 (L1 + embedded Redis) | disk_l2 | default; AB_BLOCKS=5; AB_REQUESTS=120 a block
    # AB_ENV_A / AB_ENV_B: JSON of settings for one side only (start_services)

Both services are started with the *A* tree's ``benchmarks/`` launcher (ServiceProcess), so its ``serve`` command is
one both trees understand.
"""
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

TREES = {"A": os.environ["AB_A"], "B": os.environ["AB_B"]}
sys.path.insert(0, str(Path(TREES["A"]) / "benchmarks"))

from ragcache_bench import overhead  # noqa: E402 - from the A tree, above
from ragcache_testing.instant import InstantUpstream  # noqa: E402
from ragcache_testing.service import ServiceProcess  # noqa: E402

CONFIG = os.environ.get("AB_CONFIG", "l2")
NUM_BLOCKS = int(os.environ.get("AB_BLOCKS", "5"))
NUM_REQUESTS = int(os.environ.get("AB_REQUESTS", "120"))


def start_services(upstream: InstantUpstream, work: Path, config: str) -> dict[str, ServiceProcess]:
    """Each tree's service (``AB_A``, ``AB_B``) in front of ``upstream``, with the levels of ``config`` (l2, disk_l2,
    default) and, from ``AB_ENV_A`` / ``AB_ENV_B`` (JSON), settings for one side only: one tree on both sides with a
    level turned off on one puts that level's presence side by side."""
    services = {}
    for name, tree in TREES.items():
        env = {"RAGCACHE_MODELS_JSON": upstream.models_json, "RAGCACHE_MODEL": upstream.model, "RAGCACHE_MILVUS_URI": "off",
               "RAGCACHE_DRIFT_CHECK": "false", "PYTHONPATH": f"{tree}:{tree}/benchmarks"}
        if config == "default":
            del env["RAGCACHE_MILVUS_URI"]
        if config in ("default", "disk_l2"):
            env["RAGCACHE_DISK_PATH"] = str(work / name / "disk")
        env.update(json.loads(os.environ.get(f"AB_ENV_{name}", "{}")))
        (work / name).mkdir()
        services[name] = ServiceProcess(work / name, redis_url=None, extra_env=env)
    return services


def main() -> None:
    work = Path(tempfile.mkdtemp())
    with InstantUpstream() as upstream:
        services = start_services(upstream, work, CONFIG)
        texts = overhead._Texts()
        hit_body = {"model": upstream.model, "input": [f"a repeated text {i}" for i in range(32)], "encoding_format": "base64"}
        for service in services.values():
            overhead._block(service.url + "/v1", texts.bodies(16, upstream.model, "base64"), None)  # warm
            service.post("/v1/embeddings", hit_body)
        figures = {name: {"miss": [], "texts_per_s": [], "hit": []} for name in services}
        direct = []
        try:
            for _ in range(NUM_BLOCKS):
                direct.append(overhead._block(upstream.base_url, texts.bodies(NUM_REQUESTS, upstream.model, "base64"), None).texts_per_s)
                for name, service in services.items():
                    block = overhead._block(service.url + "/v1", texts.bodies(NUM_REQUESTS, upstream.model, "base64"), service.process.pid)
                    assert block.served_by_level.get("compute") == block.texts, block.served_by_level  # all new
                    figures[name]["miss"].append(block.cpu_ms_per_text)
                    figures[name]["texts_per_s"].append(block.texts_per_s)
                    hits = overhead._block(service.url + "/v1", [hit_body] * NUM_REQUESTS * 2, service.process.pid)
                    figures[name]["hit"].append(hits.cpu_ms_per_text)
        finally:
            for service in services.values():
                service.stop()
    median = statistics.median
    print(f"straight to the upstream: {median(direct):,.0f} texts/s; load {os.getloadavg()[0]:.1f}")
    for name, tree in TREES.items():
        got = figures[name]
        print(f"{name} ({tree}): miss {median(got['miss']):.4f} ms a text, {median(got['texts_per_s']):,.0f} texts/s "
              f"({median(got['texts_per_s']) / median(direct):.3f}x), L1 hit {median(got['hit']):.4f} ms a text")
    print(f"B / A: miss CPU {median(figures['B']['miss']) / median(figures['A']['miss']):.3f}x, "
          f"hit CPU {median(figures['B']['hit']) / median(figures['A']['hit']):.3f}x")


if __name__ == "__main__":
    main()
