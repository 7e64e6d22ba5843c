"""The command line: ``ragcache serve | ingest | search | stats | bench``."""

from __future__ import annotations

import argparse
import os
import sys
from itertools import islice

from ragcache.errors import ConfigError, RagCacheError

DEFAULT_URL = "http://127.0.0.1:8000"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        outcome = args.run(args)
    except RagCacheError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # Benchmarks return their figures (already printed as a table); only an int is an exit status.
    return outcome if isinstance(outcome, int) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragcache", description=__doc__)
    commands = parser.add_subparsers(title="commands")

    serve = commands.add_parser("serve", help="start the HTTP service")
    serve.add_argument("--host", default=None, help="default: RAGCACHE_HOST or 127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="default: RAGCACHE_PORT or 8000")
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--config", help="settings file (RAGCACHE_* lines, dotenv form)")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(run=run_serve)

    for name, help_text in [("ingest", "add files to a collection"), ("search", "search a collection"), ("stats", "hit rates as a table")]:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--url", default=os.environ.get("RAGCACHE_URL", DEFAULT_URL), help="the service's base URL")
        sub.add_argument("--api-key", default=os.environ.get("RAGCACHE_API_KEY"))
        if name == "ingest":
            sub.add_argument("path", help="a .txt/.md/.rst/.jsonl file, or a folder of them")
            sub.add_argument("--collection", required=True)
            sub.add_argument("--chunk-chars", type=int, default=1200)
            sub.add_argument("--batch", type=int, default=256, help="documents per request")
        elif name == "search":
            sub.add_argument("query")
            sub.add_argument("--collection", required=True)
            sub.add_argument("--top-k", type=int, default=5)
            sub.add_argument("--filter", default=None)
        sub.set_defaults(run=globals()[f"run_{name}"])

    milvus = commands.add_parser("milvus-server", help="serve a Milvus Lite database to many processes (replicas) on loopback")
    milvus.add_argument("--db", required=True, help="the database file (.db), created when absent")
    milvus.add_argument("--port", type=int, default=19530)
    milvus.set_defaults(run=run_milvus_server)

    try:
        from ragcache.bench import add_bench_commands
    except ImportError:
        pass
    else:
        add_bench_commands(commands)
    return parser


def run_serve(args) -> int:
    import uvicorn

    from ragcache.settings import Settings

    if args.config:
        os.environ["RAGCACHE_SETTINGS_FILE"] = args.config  # read again by each worker's app factory
    settings = Settings.load(args.config)
    if args.workers > 1 and (settings.redis_url is None or settings.resolved_milvus_uri and settings.resolved_milvus_uri.endswith(".db")):
        raise RagCacheError(
            "--workers > 1 needs shared stores: set RAGCACHE_REDIS_URL to a Redis server and RAGCACHE_MILVUS_URI "
            "to a Milvus server (an embedded Redis and Milvus Lite belong to one process)"
        )
    uvicorn.run(
        "services.app:app_from_environment",
        factory=True,
        host=args.host or settings.host,
        port=args.port or settings.port,
        workers=args.workers,
        log_level=args.log_level,
        timeout_graceful_shutdown=30,
    )
    return 0


def run_milvus_server(args) -> int:
    """Milvus Lite on 127.0.0.1:PORT until Ctrl-C or SIGTERM; replicas set RAGCACHE_MILVUS_URI to its URL."""
    import signal

    from ragcache.embedded_milvus import MilvusLiteServer

    if not args.db.endswith(".db"):
        raise ConfigError(f"--db {args.db!r}: a Milvus Lite database is a path ending in .db")
    # SIGTERM (docker stop, systemd) ends the wait below like Ctrl-C, so the child milvus is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = MilvusLiteServer(args.db, port=args.port)
    print(f"Milvus Lite serving {server.db_path} at {server.url} (set RAGCACHE_MILVUS_URI={server.url})", flush=True)
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _client(args):
    from ragcache.client import Client

    return Client(args.url, api_key=args.api_key)


def run_ingest(args) -> int:
    from tqdm import tqdm

    from ragcache.ingest import iter_documents

    documents = iter_documents(args.path, max_chars=args.chunk_chars)
    totals = {"received": 0, "computed": 0}
    with _client(args) as client, tqdm(unit="doc", desc=f"ingest -> {args.collection}") as progress:
        while batch := list(islice(documents, args.batch)):
            result = client.add_documents(args.collection, batch)
            totals["received"] += result.num_received
            totals["computed"] += result.num_computed
            progress.update(len(batch))
    print(f"{totals['received']} documents in {args.collection!r} ({totals['computed']} embeddings computed, the rest from cache)")
    return 0


def run_search(args) -> int:
    with _client(args) as client:
        result = client.search(args.query, collection=args.collection, top_k=args.top_k, filter=args.filter)
    for rank, hit in enumerate(result.hits, start=1):
        text = " ".join(hit.text.split())
        print(f"{rank:>2}. {hit.score:.4f}  {hit.id}  {text[:100]}")
    print(f"({len(result.hits)} hits; query embedding from {result.embedding_level}; {result.timings_ms.total:.1f} ms)")
    return 0


def run_stats(args) -> int:
    with _client(args) as client:
        stats = client.stats()
    for model, entry in stats["models"].items():
        overall = entry["since_start"]
        print(f"{model}  (space {entry['space']['space_id']})")
        print(f"  texts {overall['texts']}  hit rate {overall['hit_rate']:.3f}  computed {overall['texts_computed']}  "
              f"compute saved {overall['compute_s_saved']:.1f} s")
        print(f"  {'level':<6}{'up':<5}{'lookups':>10}{'hits':>10}{'misses':>10}{'errors':>8}{'hit rate':>10}{'p50 ms':>9}{'p99 ms':>9}")
        for level in overall["levels"]:
            up = "yes" if entry["levels"][level["level"]]["up"] else "NO"
            print(f"  {level['level']:<6}{up:<5}{level['lookups']:>10}{level['hits']:>10}{level['misses']:>10}{level['errors']:>8}"
                  f"{level['hit_rate']:>10.3f}{level['latency_p50_ms']:>9.3f}{level['latency_p99_ms']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
