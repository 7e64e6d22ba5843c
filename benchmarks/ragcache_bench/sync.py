"""``bench sync``: re-ingesting a 10,000-document folder with nothing changed, through ``ragcache ingest --sync``.

The folder: 10 JSONL files of 1,000 standard-library passages each (``corpus_chunks``). The command runs in
this process against the real service (``ragcache serve``), exactly as a user types it. Its document vectors
are made resident in the service's L2 first (random unit vectors under the documents' real keys, as
``bench search`` does): the first ingest then costs Milvus writes, not 10,000 model calls, and what is timed
is the re-ingest, which must embed and write nothing. Then one file changes (a passage edited, one removed)
and another file is deleted, and the counts of the sync are checked.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from pathlib import Path

import numpy as np

from ragcache_bench.context import BenchContext
from ragcache_bench.corpus import corpus_chunks
from ragcache_bench.http import _seed_l2, _service
from ragcache_bench.report import BenchResult, Target

FILES = 10
COLLECTION = "bench_sync"
_SUMMARY = re.compile(r"(\d+) documents in .*?: (\d+) unchanged, (\d+) replaced, (\d+) added, (\d+) deleted \((\d+) embeddings computed")


def _write_folder(folder: Path, texts: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    per_file = len(texts) // FILES
    for number in range(FILES):
        part = texts[number * per_file : (number + 1) * per_file]
        lines = [json.dumps({"id": f"f{number}-{i}", "text": text}) for i, text in enumerate(part)]
        (folder / f"part-{number}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _ingest(url: str, folder: Path) -> tuple[float, dict[str, int]]:
    """Run ``ragcache ingest FOLDER --sync``; (seconds, its counts)."""
    from ragcache_cli.cli import main

    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(["ingest", str(folder), "--collection", COLLECTION, "--url", url, "--sync", "--quiet"])
    seconds = time.perf_counter() - started
    match = _SUMMARY.search(out.getvalue())
    if code != 0 or match is None:
        raise RuntimeError(f"ragcache ingest failed ({code}): {out.getvalue()[-500:]}")
    names = ("received", "unchanged", "replaced", "added", "deleted", "computed")
    return seconds, dict(zip(names, map(int, match.groups())))


def bench_sync(ctx: BenchContext) -> BenchResult:
    num_documents = 2_000 if ctx.quick else 10_000
    result = BenchResult("sync", f"re-ingest of a {num_documents:,}-document folder, nothing changed (ragcache ingest --sync)")
    service = _service(ctx)
    texts = corpus_chunks(ctx.corpus, num_documents)
    rng = np.random.default_rng(ctx.seed)
    vectors = rng.standard_normal((len(texts), ctx.encoder.dim), dtype=np.float32)
    _seed_l2(ctx, texts, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    folder = ctx.workdir / "sync-folder"
    _write_folder(folder, texts)

    first_s, first = _ingest(service.url, folder)
    again_s, again = _ingest(service.url, folder)
    result.add("first ingest", first_s, "s", note=f"{first['added']:,} added, {first['computed']} computed (vectors were in L2)")
    unchanged = again["unchanged"] == num_documents and again["computed"] == 0 and again["replaced"] == again["added"] == 0
    result.add(
        "re-ingest, nothing changed", again_s if unchanged else f"wrong counts: {again}", "s", target=Target("<=", 10.0),
        goal="13", note=f"{again['unchanged']:,} unchanged, 0 embedded, 0 written; {num_documents / again_s:,.0f} docs/s",
    )
    result.add("first / re-ingest", first_s / again_s, "x")

    edited = folder / "part-0.jsonl"
    lines = edited.read_text(encoding="utf-8").splitlines()
    lines[0] = json.dumps({"id": "f0-0", "text": "An edited passage."})
    edited.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")  # one edited, the last one gone
    (folder / "part-1.jsonl").unlink()  # a whole file gone
    changed_s, changed = _ingest(service.url, folder)
    per_file = num_documents // FILES
    expected = {"replaced": 1, "added": 0, "deleted": per_file + 1, "unchanged": num_documents - per_file - 2}
    correct = all(changed[name] == count for name, count in expected.items())
    result.add("sync after 1 edit, 1 removal, 1 file deleted", changed_s if correct else f"wrong counts: {changed}", "s",
               target=Target("<=", 10.0), goal="13", note=f"{changed}")
    result.details = {"documents": num_documents, "first": first, "again": again, "changed": changed, "expected": expected}
    return result
