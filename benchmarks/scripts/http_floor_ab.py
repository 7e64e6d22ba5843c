"""A/B in one run: ``bench http-floor``'s L1-hit figure for two source trees side by side (issue 41: a refactor shows
its http-floor ratio against the commit before it). Each tree's ragcache app under uvicorn, started by that tree's own
launcher (``run_server`` with its bounds), and the bare app, all in front of the same instant upstream; alternating
blocks of 32-text L1 hits, base64 and JSON; CPU ms a request of each server's process tree; verdicts are medians of
block-by-block ratios (``http_floor._paired_ratio``). Run it from a folder that is not a checkout:

    git worktree add /tmp/old <rev>      # and build its C extensions: python -c "import setuptools; setuptools.setup()" build_ext --inplace
    cd /tmp && AB_A=/tmp/old AB_B=/work/main AB_OUT=/work/main/benchmarks/results/<dir>/http_floor_ab.json \
        /work/main/.venv/bin/python /work/main/benchmarks/scripts/http_floor_ab.py    # AB_BLOCKS=7 AB_REQUESTS=300
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TREES = {"A": os.environ["AB_A"], "B": os.environ["AB_B"]}
sys.path.insert(0, str(Path(TREES["B"]) / "benchmarks"))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from ragcache.storage.processes import free_port, stop_process, wait_healthy  # noqa: E402
from ragcache_bench.http_floor import TEXTS_PER_REQUEST, Server, _cpu_per_request_ms, _paired_ratio, _post, _start  # noqa: E402
from ragcache_testing.instant import InstantUpstream  # noqa: E402

NUM_BLOCKS = int(os.environ.get("AB_BLOCKS", "7"))
NUM_REQUESTS = int(os.environ.get("AB_REQUESTS", "300"))


def _start_tree(tree: str, env: dict[str, str], workdir: Path) -> Server:
    """The tree's app under uvicorn as its own ``ragcache serve`` runs it (the CLI moved in issue 41: either place)."""
    cli = "ragcache_cli.cli" if (Path(tree) / "ragcache_cli" / "cli.py").exists() else "ragcache.app.cli"
    port = free_port()
    code = (f"from {cli} import SERVE_OPTIONS; from ragcache.settings import Settings; "
            "from ragcache_server.serving import ServeConfig, bounds_of, run_server; "
            f"run_server(ServeConfig('ragcache_server.app:app_from_environment', factory=True, host='127.0.0.1', port={port}, "
            "loop='uvloop', log_level='warning', **bounds_of(Settings.load().service, Settings.load().access), **SERVE_OPTIONS))")
    log_path = workdir / f"uvicorn-{Path(tree).name}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env, "PYTHONPATH": tree},
                                   stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    wait_healthy(process, f"http://127.0.0.1:{port}/health", name=tree, timeout_s=180, interval_s=0.25,
                 log_tail=lambda: log_path.read_text(errors="replace")[-3000:])
    return Server("uvicorn", tree, process, port, log_path)


def main() -> None:
    workdir = Path(tempfile.mkdtemp())
    texts = [f"a repeated text {i} about caches and vectors" for i in range(TEXTS_PER_REQUEST)]
    load_before = os.getloadavg()
    with InstantUpstream() as upstream:
        env = {"RAGCACHE_MODELS_JSON": upstream.models_json, "RAGCACHE_MODEL": upstream.model, "RAGCACHE_REDIS_URL": "off",
               "RAGCACHE_MILVUS_URI": "off", "RAGCACHE_DRIFT_CHECK": "false", "RAGCACHE_HEADER_TIMEOUT_S": "10",
               "HF_HUB_OFFLINE": "1"}
        bodies = {encoding: orjson.dumps({"model": upstream.model, "input": texts, "encoding_format": encoding})
                  for encoding in ("base64", "float")}
        servers: dict[str, Server] = {}
        try:
            for name, tree in TREES.items():
                servers[name] = _start_tree(tree, {**env, "RAGCACHE_DATA_DIR": str(workdir / name)}, workdir)
            answers = {encoding: _post(servers["B"].url, body).content for encoding, body in bodies.items()}
            first = orjson.loads(answers["float"])
            np.save(workdir / "vectors.npy", np.asarray([item["embedding"] for item in first["data"]], dtype="<f4"))
            servers["bare"] = _start("uvicorn", "bare", {"RAGCACHE_BARE_VECTORS": str(workdir / "vectors.npy"),
                                                         "RAGCACHE_BARE_MODEL": first["model"],
                                                         "RAGCACHE_BARE_TOKENS": str(first["usage"]["prompt_tokens"])}, workdir)
            same_bytes = {name: {encoding: _post(server.url, body).content == answers[encoding] for encoding, body in bodies.items()}
                          for name, server in servers.items()}
            for server in servers.values():  # warm: connections, code paths
                for body in bodies.values():
                    _cpu_per_request_ms(server, body, 50)
            samples: dict[str, list[float]] = {}
            for _ in range(NUM_BLOCKS):
                for encoding, body in bodies.items():
                    for name, server in servers.items():
                        samples.setdefault(f"{name}/{encoding}", []).append(_cpu_per_request_ms(server, body, NUM_REQUESTS))
        finally:
            for server in servers.values():
                stop_process(server.process, timeout_s=40)
    medians = {key: statistics.median(values) for key, values in samples.items()}
    ratios = {}
    for encoding in ("base64", "float"):
        ratios[f"B/A {encoding}"] = _paired_ratio(samples[f"B/{encoding}"], samples[f"A/{encoding}"])
        for name in ("A", "B"):
            ratios[f"{name}/bare {encoding}"] = _paired_ratio(samples[f"{name}/{encoding}"], samples[f"bare/{encoding}"])
    print(f"load {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; {NUM_BLOCKS} blocks of {NUM_REQUESTS} requests")
    for encoding in ("base64", "float"):
        print(f"{encoding}: A {medians[f'A/{encoding}']:.3f}, B {medians[f'B/{encoding}']:.3f}, bare {medians[f'bare/{encoding}']:.3f} "
              f"ms CPU a request; B/A {ratios[f'B/A {encoding}']:.3f}x, A/bare {ratios[f'A/bare {encoding}']:.2f}x, "
              f"B/bare {ratios[f'B/bare {encoding}']:.2f}x (paired medians)")
    out = os.environ.get("AB_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"script": "benchmarks/scripts/http_floor_ab.py", "trees": TREES, "blocks": NUM_BLOCKS,
                                         "requests_per_block": NUM_REQUESTS, "load": [load_before[0], os.getloadavg()[0]],
                                         "same_bytes_as_B": same_bytes, "samples_ms": samples, "median_ms": medians,
                                         "paired_ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
