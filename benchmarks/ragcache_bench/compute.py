"""``ragcache bench compute``: how fast the model computes, per backend, against other embedding engines.

The same unseen passages, in batches of 32, through:

- ragcache's encoders in this process: torch (``ModelEncoder``), ONNX Runtime and ONNX Runtime int8
  (``OnnxEncoder``, exported here into the bench's workdir);
- fastembed (its own venv, ``mk/fastembed.mk``; a worker process) loading the ONNX file ragcache exported,
  since its own models come from a hub this machine cannot reach;
- Infinity (``infinity-emb``), over loopback HTTP: its torch engine (its venv, ``mk/infinity.mk``) and its
  optimum engine (ONNX Runtime; another venv, ``mk/infinity_onnx.mk``) on the ONNX file ragcache exported.

Computed texts/s of each are measured side by side (``report.interleaved``: one call of each per round,
in rotating order), so the ratios hold under the background load of a shared machine. Each system's
largest cosine distance from the torch vectors is reported beside its rate.

Like for like: every passage fits in ``MAX_TOKENS`` tokens of the model's tokenizer (special tokens included),
so no system truncates any (sentence-transformers stops at 256, fastembed and Infinity's optimum engine at 512:
on longer passages they would do different work and give different vectors). The headline verdict weighs
float32 against float32 with every system in the same position, over loopback HTTP: ragcache's service (its
faster float32 backend in process; L1 + L2 written, no L3) against Infinity's torch and optimum engines, fresh
texts each round. The in-process table (fastembed in a worker process beside it) and int8 (its own figure, with
its cosine distance from the torch vectors) are reported apart. Then one 32-text request repeated: ragcache
answers from L1; Infinity has no cache and computes it again each time.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import torch

from ragcache_bench.context import BATCH_SIZE, BenchContext
from ragcache_bench.report import BenchResult, Target, interleaved, median
from ragcache_testing.service import ServiceProcess, served

__all__ = ["bench_compute", "fitting_texts", "in_process", "like_for_like"]

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BACKENDS = ("torch", "onnx", "onnx-int8")
# The packaged model's files fastembed needs beside the ONNX file (its tokenizer and the model's config).
_FASTEMBED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
# Infinity's optimum engine: ONNX Runtime on the same exported file (its own graph optimisation fails with
# optimum 2.1, "unexpected keyword argument 'optimize_with_onnxruntime_only'", and it runs the file as given).
INFINITY_ONNX = "Infinity optimum (HTTP)"
INFINITY_TORCH = "Infinity torch (HTTP)"
FASTEMBED = "fastembed (ONNX)"
NOTES = {FASTEMBED: "in a worker process", INFINITY_ONNX: "over HTTP", INFINITY_TORCH: "over HTTP"}
MAX_TOKENS = 256  # sentence-transformers' limit for this model: no passage is truncated by any system
REPEATED_TARGET = 10.0  # a repeated request from L1 against a server that recomputes it: at least 10x


def bench_compute(ctx: BenchContext) -> BenchResult:
    from ragcache.models.local import ModelEncoder
    from ragcache.models.onnx import OnnxEncoder

    result = BenchResult("compute", "computed texts/s: torch, ONNX, ONNX-int8 vs fastembed and Infinity (14.2, 14.3)")
    num_batches, repeats = (8, 3) if ctx.quick else (32, 5)
    texts = fitting_texts(ctx, num_batches * BATCH_SIZE, skip=9000)
    threads = torch.get_num_threads()
    onnx_dir = ctx.workdir / "onnx"
    onnx = OnnxEncoder(backend="onnx", cache_dir=onnx_dir, batch_size=BATCH_SIZE)
    encoders: dict[str, ModelEncoder] = {
        "ragcache torch": ModelEncoder(batch_size=BATCH_SIZE),
        "ragcache onnx": onnx,
        "ragcache onnx-int8": OnnxEncoder(backend="onnx-int8", cache_dir=onnx_dir, batch_size=BATCH_SIZE),
    }
    reference = encoders["ragcache torch"].encode(texts).numpy()
    result.details.update(texts=len(texts), batch_size=BATCH_SIZE, threads=threads, load_average=os.getloadavg())
    with ExitStack() as stack:
        systems: dict[str, Callable[[], object]] = {name: partial(encoder.encode, texts) for name, encoder in encoders.items()}
        vectors = {name: encoder.encode(texts).numpy() for name, encoder in encoders.items()}
        not_run: dict[str, str] = {}
        onnx_path = onnx.onnx_path
        fastembed = _start_fastembed(stack, ctx, onnx_path, threads, texts, not_run)
        if fastembed is not None:
            systems[FASTEMBED] = fastembed.run
            vectors[FASTEMBED] = fastembed.vectors()
        infinity = _start_infinity(stack, ctx, not_run)
        infinity_onnx = _start_infinity_onnx(stack, ctx, onnx_path, not_run)
        for name, client in ((INFINITY_TORCH, infinity), (INFINITY_ONNX, infinity_onnx)):
            if client is not None:
                systems[name] = partial(client.embed_all, texts)
                vectors[name] = client.embed_all(texts)
        samples = interleaved(systems, repeats=repeats, warmup=1)
        rates = {name: len(texts) / median(seconds) for name, seconds in samples.items()}
        distances = {name: _largest_cosine_distance(reference, found) for name, found in vectors.items()}
        for name, rate in rates.items():
            result.add(f"computed: {name}", rate, "texts/s",
                       note=f"largest cosine distance from torch {distances[name]:.2g}; median of {repeats}"
                       + (f"; {NOTES[name]}" if name in NOTES else ""))
        for name, why in not_run.items():
            result.add(f"computed: {name}", "not run", note=why)
        in_process(result, rates, distances)
        result.details["samples_s"] = samples
        result.details["max_tokens"] = MAX_TOKENS
        peers_http = {name: client for name, client in ((INFINITY_TORCH, infinity), (INFINITY_ONNX, infinity_onnx)) if client}
        best = max(("torch", "onnx"), key=lambda backend: rates[f"ragcache {backend}"])
        _http(ctx, result, peers_http, best, repeats, not_run)
    return result


def fitting_texts(ctx: BenchContext, count: int, *, skip: int) -> list[str]:
    """``count`` unseen passages from ``skip`` on that fit in ``MAX_TOKENS`` tokens (the rare longer one left out)."""
    from transformers import AutoTokenizer

    from ragcache_testing.infinity import packaged_model_folder

    tokenizer = AutoTokenizer.from_pretrained(str(packaged_model_folder()))
    candidates = ctx.unseen_texts(count + count // 10 + 16, skip=skip)
    lengths = [len(ids) for ids in tokenizer(candidates)["input_ids"]]
    fitting = [text for text, length in zip(candidates, lengths) if length <= MAX_TOKENS]
    if len(fitting) < count:
        raise RuntimeError(f"only {len(fitting)} of {len(candidates)} passages fit in {MAX_TOKENS} tokens, {count} needed")
    return fitting[:count]


def in_process(result: BenchResult, rates: dict[str, float], distances: dict[str, float]) -> None:
    """The in-process table's ratios, informational: float32 and int8 apart (the headline is over HTTP)."""
    peers = {name: rate for name, rate in rates.items() if not name.startswith("ragcache")}
    if not peers:
        return
    fastest_peer = max(peers, key=peers.__getitem__)
    best_float32 = max(("ragcache torch", "ragcache onnx"), key=rates.__getitem__)
    result.add("in process: ragcache best float32 / fastest peer", rates[best_float32] / peers[fastest_peer], "x",
               note=f"{best_float32} (cosine {distances[best_float32]:.2g}) vs {fastest_peer} "
               f"(cosine {distances[fastest_peer]:.2g}); no text truncated; fastembed in a worker process, Infinity over HTTP")
    result.add("int8: ragcache onnx-int8 / fastest peer", rates["ragcache onnx-int8"] / peers[fastest_peer], "x",
               note=f"not like for like: int8 weights, largest cosine distance from torch {distances['ragcache onnx-int8']:.3f} "
               f"(float32 peers: {max(distances[name] for name in peers):.2g})")


def _largest_cosine_distance(reference: np.ndarray, found: np.ndarray) -> float:
    a = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    b = found / np.linalg.norm(found, axis=1, keepdims=True)
    return float((1 - (a * b).sum(axis=1)).max())


# ---- fastembed ---------------------------------------------------------------------------------------------


class _FastembedWorker:
    """The worker process (benchmarks/ragcache_bench/fastembed_worker.py) in the fastembed venv: one JSON line each way."""

    def __init__(self, python: Path, folder: Path, threads: int, texts: list[str], log_path: Path):
        worker = Path(__file__).with_name("fastembed_worker.py")
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        self._log = log_path.open("wb")
        # -P: not the script's folder first on sys.path (benchmarks/ragcache_bench/http.py would shadow the stdlib's http).
        self.process = subprocess.Popen([str(python), "-P", str(worker), str(folder), str(threads), str(BATCH_SIZE)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env, text=True)
        self._ask(None)  # {"ready": true} once the model is loaded
        self._ask({"op": "load", "texts": texts})

    def _ask(self, request: dict | None) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        if request is not None:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fastembed worker exited ({self.process.wait(10)}); see {self._log.name}")
        return json.loads(line)

    def run(self) -> None:
        self._ask({"op": "run"})

    def vectors(self) -> np.ndarray:
        answer = self._ask({"op": "vectors"})
        return np.frombuffer(base64.b64decode(answer["data"]), dtype="<f4").reshape(answer["shape"])

    def close(self) -> None:
        from ragcache.storage.processes import stop_process

        if self.process.stdin is not None:
            self.process.stdin.close()
        stop_process(self.process, timeout_s=10)
        self._log.close()


def _start_fastembed(stack: ExitStack, ctx: BenchContext, onnx_path: Path, threads: int, texts: list[str],
                     not_run: dict[str, str]) -> _FastembedWorker | None:
    python = Path(os.environ.get("RAGCACHE_FASTEMBED_PYTHON") or ".venv-fastembed/bin/python")
    if not python.exists():
        not_run[FASTEMBED] = f"not run: no fastembed environment at {python} (`make fastembed-env`)"
        return None
    from ragcache_testing.infinity import packaged_model_folder

    # fastembed's own all-MiniLM-L6-v2 comes from a hub; this folder gives it the same model, offline.
    folder = ctx.workdir / "fastembed-model"
    folder.mkdir(exist_ok=True)
    for name in _FASTEMBED_FILES:
        shutil.copyfile(packaged_model_folder() / name, folder / name)
    shutil.copyfile(onnx_path, folder / "model.onnx")
    worker = _FastembedWorker(python, folder, threads, texts, ctx.workdir / "fastembed.log")
    stack.callback(worker.close)
    return worker


# ---- Infinity and the HTTP figures ---------------------------------------------------------------------------


class _Embeddings:
    """OpenAI-style /embeddings calls (base64, as the ``openai`` SDK sends), batch by batch, one at a time."""

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self.http = httpx.Client(timeout=120.0)

    def embed(self, texts: list[str]) -> tuple[httpx.Response, np.ndarray]:
        response = self.http.post(self.url, json={"model": self.model, "input": texts, "encoding_format": "base64"})
        if response.status_code != 200:
            raise RuntimeError(f"{self.url} answered {response.status_code}: {response.text[:300]}")
        rows = [base64.b64decode(item["embedding"]) for item in response.json()["data"]]
        return response, np.frombuffer(b"".join(rows), dtype="<f4").reshape(len(rows), -1)

    def embed_all(self, texts: list[str]) -> np.ndarray:
        return np.concatenate([self.embed(texts[i : i + BATCH_SIZE])[1] for i in range(0, len(texts), BATCH_SIZE)])

    def close(self) -> None:
        self.http.close()


def _start_infinity(stack: ExitStack, ctx: BenchContext, not_run: dict[str, str]) -> _Embeddings | None:
    from ragcache_bench.providers import infinity_python
    from ragcache_testing.infinity import InfinityServer, InfinityServerConfig, packaged_model_folder

    try:
        python = infinity_python()
    except RuntimeError as exc:
        not_run[INFINITY_TORCH] = f"not run: {exc}"
        return None
    config = InfinityServerConfig(python=python, model=packaged_model_folder(), batch_size=BATCH_SIZE,
                                  log_path=ctx.workdir / "infinity-compute.log")
    server = stack.enter_context(InfinityServer(config))
    client = _Embeddings(f"{server.base_url}/embeddings", server.model_id)
    stack.callback(client.close)
    return client


def _start_infinity_onnx(stack: ExitStack, ctx: BenchContext, onnx_path: Path, not_run: dict[str, str]) -> _Embeddings | None:
    """Infinity's optimum engine (its own venv, mk/infinity_onnx.mk) on a copy of the model folder holding the
    ONNX file ragcache exported: optimum would export one itself only through optimum-onnx's exporter."""
    from ragcache_testing.infinity import InfinityServer, InfinityServerConfig, packaged_model_folder

    python = Path(os.environ.get("RAGCACHE_INFINITY_ONNX_PYTHON") or ".venv-infinity-onnx/bin/python")
    if not python.exists():
        not_run[INFINITY_ONNX] = f"not run: no Infinity optimum environment at {python} (`make infinity-onnx-env`)"
        return None
    folder = ctx.workdir / "infinity-onnx-model"
    shutil.copytree(packaged_model_folder(), folder, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))  # no torch weights: it must load the ONNX
    shutil.copyfile(onnx_path, folder / "model.onnx")
    config = InfinityServerConfig(python=python, model=Path("."), cwd=folder, served_model_name="minilm-onnx",
                                  engine="optimum", batch_size=BATCH_SIZE,
                                  # its optimum engine pools the CLS token unless told (the model pools the mean)
                                  extra_args=("--pooling-method", "mean"), log_path=ctx.workdir / "infinity-onnx.log")
    server = stack.enter_context(InfinityServer(config))
    client = _Embeddings(f"{server.base_url}/embeddings", server.model_id)
    stack.callback(client.close)
    return client


def _http(ctx: BenchContext, result: BenchResult, peers: dict[str, _Embeddings], backend: str, repeats: int,
          not_run: dict[str, str]) -> None:
    """Like for like over HTTP: ragcache's service on the float32 ``backend`` vs each float32 peer, fresh texts
    each round (all compute); then one request repeated (ragcache from L1, the peers recompute)."""
    if not peers:
        result.add("like for like: ragcache / fastest peer, float32 over HTTP", "not run", target=Target(">=", 1.0),
                   goal="14.2", note="; ".join(not_run.values()))
        return
    num_batches = 4 if ctx.quick else 16
    count = num_batches * BATCH_SIZE
    chunks = [fitting_texts(ctx, count, skip=12000 + i * (count + count // 10 + 16)) for i in range(repeats + 1)]
    env = {"RAGCACHE_MODEL_BACKEND": backend, "RAGCACHE_MILVUS_URI": "off", "RAGCACHE_DRIFT_CHECK_INTERVAL_S": "0"}
    service = ServiceProcess(ctx.workdir, redis_url=ctx.redis_url, extra_env=env)
    ragcache = _Embeddings(f"{service.url}/v1/embeddings", MODEL)
    try:
        computed = {"ragcache": 0}
        fresh = {name: iter(chunks) for name in ("ragcache", *peers)}

        def ragcache_fresh() -> None:
            for index in range(0, len(chunk := next(fresh["ragcache"])), BATCH_SIZE):
                computed["ragcache"] += served(ragcache.embed(chunk[index : index + BATCH_SIZE])[0])["Compute"]

        def peer_fresh(name: str) -> None:
            peers[name].embed_all(next(fresh[name]))

        calls: dict[str, Callable[[], object]] = {"ragcache": ragcache_fresh}
        calls.update({name: partial(peer_fresh, name) for name in peers})
        samples = interleaved(calls, repeats=repeats, warmup=1)
        rates = {name: count / median(seconds) for name, seconds in samples.items()}
        result.add(f"HTTP computed: ragcache ({backend})", rates["ragcache"], "texts/s",
                   note=f"/v1/embeddings, base64, L1+L2 written, no L3; {num_batches} requests of {BATCH_SIZE}")
        for name in peers:
            result.add(f"HTTP computed: {name}", rates[name], "texts/s", note="/embeddings, base64")
        fastest = like_for_like(result, rates, backend, all_computed=computed["ragcache"] == count * (repeats + 1))
        result.details["http_computed_samples_s"] = samples
        _repeated(ctx, result, ragcache, peers[fastest], fastest, repeats)
    finally:
        ragcache.close()
        service.stop()


def like_for_like(result: BenchResult, rates: dict[str, float], backend: str, *, all_computed: bool) -> str:
    """The headline: ragcache's float32 service against the fastest float32 peer over HTTP (``rates``: texts/s
    of "ragcache" and of each peer that ran); a peer that did not run fails it. Returns the fastest peer."""
    peers = {name: rate for name, rate in rates.items() if name != "ragcache"}
    fastest = max(peers, key=peers.__getitem__)
    result.add("like for like: ragcache / fastest peer, float32 over HTTP", rates["ragcache"] / peers[fastest], "x",
               target=Target(">=", 1.0), goal="14.2",
               note=f"ragcache {backend} vs {fastest}; fresh texts each round, the same for all; none over {MAX_TOKENS} tokens",
               requires={"every ragcache text computed": all_computed,
                         "Infinity torch ran": INFINITY_TORCH in peers, "Infinity optimum ran": INFINITY_ONNX in peers})
    return fastest


def _repeated(ctx: BenchContext, result: BenchResult, ragcache: _Embeddings, peer: _Embeddings, peer_name: str,
              repeats: int) -> None:
    hot = fitting_texts(ctx, BATCH_SIZE, skip=11000)
    ragcache.embed(hot)
    hits = {"L1": 0}

    def ragcache_hot() -> None:
        hits["L1"] += served(ragcache.embed(hot)[0])["L1"]

    samples = interleaved({"ragcache": ragcache_hot, "peer": lambda: peer.embed(hot)}, repeats=repeats * 3)
    rates = {name: BATCH_SIZE / median(seconds) for name, seconds in samples.items()}
    result.add("HTTP repeated: ragcache (L1)", rates["ragcache"], "texts/s", note="one 32-text request, again")
    result.add(f"HTTP repeated: {peer_name} (recomputes)", rates["peer"], "texts/s", note="no cache: each repeat is computed again")
    result.add("HTTP repeated: ragcache / peer", rates["ragcache"] / rates["peer"], "x", target=Target(">=", REPEATED_TARGET),
               note=f"vs {peer_name}", requires={"every repeat from L1": hits["L1"] == BATCH_SIZE * (repeats * 3 + 1)})
