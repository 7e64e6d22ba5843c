"""A/B in one run: ragcache at an older commit (plain uvicorn, as its `ragcache serve` ran it) against this checkout
(uvicorn with ragcache_server/serving.py) and the bare app (ragcache_testing/bare_app.py), all on uvicorn, in
alternating blocks; CPU ms per 32-text L1-hit request of each server's process tree (benchmarks/notes/issue-29-http-floor.md).

    git archive 51aeee0 | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    .venv/bin/python benchmarks/scripts/http_floor_ab.py            # BLOCKS=5 N=400; writes /tmp/http_floor_ab.json
"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson

from ragcache.storage.processes import free_port, stop_process, wait_healthy
from ragcache_bench.http_floor import TEXTS_PER_REQUEST, Server, _cpu_per_request_ms, _post, _start
from ragcache_testing.instant import InstantUpstream

OLD = os.environ.get("AB_OLD_TREE", "/tmp/old")  # the older commit's files (git archive, above)

wd = Path(os.environ.get("AB_WORKDIR", "/tmp/http-floor-ab"))
wd.mkdir(parents=True, exist_ok=True)


def start_old(env):
    port = free_port()
    code = ("import uvicorn; from ragcache_cli.cli import SERVE_OPTIONS; "
            f"uvicorn.run('ragcache_server.app:app_from_environment', factory=True, host='127.0.0.1', port={port}, "
            "log_level='warning', **SERVE_OPTIONS)")
    log = (wd / "old.log").open("wb")
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env, "PYTHONPATH": f"{OLD}:{OLD}/benchmarks"},
                         stdout=log, stderr=subprocess.STDOUT, cwd=OLD)
    wait_healthy(p, f"http://127.0.0.1:{port}/health", name="old", timeout_s=180, interval_s=0.25, log_tail=lambda: "")
    return Server("uvicorn", "old", p, port, wd / "old.log")


blocks, n = int(os.environ.get("BLOCKS", "5")), int(os.environ.get("N", "400"))
texts = [f"a repeated text {i} about caches and vectors" for i in range(TEXTS_PER_REQUEST)]
with InstantUpstream() as up:
    env = {"RAGCACHE_MODELS_JSON": up.models_json, "RAGCACHE_MODEL": up.model, "RAGCACHE_REDIS_URL": "off",
           "RAGCACHE_MILVUS_URI": "off", "RAGCACHE_DRIFT_CHECK": "false", "RAGCACHE_DATA_DIR": str(wd / "data"),
           "RAGCACHE_DISK_PATH": "off", "HF_HUB_OFFLINE": "1"}
    bodies = {e: orjson.dumps({"model": up.model, "input": texts, "encoding_format": e}) for e in ("base64", "float")}
    servers = [_start("uvicorn", "ragcache", env, wd), start_old({**env, "RAGCACHE_DATA_DIR": str(wd / "data-old")})]
    first = orjson.loads(_post(servers[0].url, bodies["float"]).content)
    np.save(wd / "v.npy", np.asarray([d["embedding"] for d in first["data"]], dtype="<f4"))
    servers.append(_start("uvicorn", "bare", {"RAGCACHE_BARE_VECTORS": str(wd / "v.npy"), "RAGCACHE_BARE_MODEL": first["model"],
                                                "RAGCACHE_BARE_TOKENS": str(first["usage"]["prompt_tokens"])}, wd))
    same = {s.app: {e: _post(s.url, b).content == _post(servers[0].url, b).content for e, b in bodies.items()} for s in servers}
    for s in servers:
        for b in bodies.values():
            _cpu_per_request_ms(s, b, 50)
    samples = {}
    for _ in range(blocks):
        for e, b in bodies.items():
            for s in servers:
                samples.setdefault(f"{s.app}/{e}", []).append(_cpu_per_request_ms(s, b, n))
    for s in servers:
        stop_process(s.process, timeout_s=30)
med = {k: statistics.median(v) for k, v in samples.items()}
out = {"load": os.getloadavg(), "same_bytes_as_new": same, "samples_ms": samples, "median_ms": med,
       "ratios": {e: {"new/bare": med[f"ragcache/{e}"] / med[f"bare/{e}"], "old/bare": med[f"old/{e}"] / med[f"bare/{e}"],
                      "new/old": med[f"ragcache/{e}"] / med[f"old/{e}"]} for e in bodies}}
print(json.dumps(out, indent=1))
Path("/tmp/http_floor_ab.json").write_text(json.dumps(out, indent=1))
