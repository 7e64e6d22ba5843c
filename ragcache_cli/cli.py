"""The ragcache command line: serve, ingest, search, rerank, stats, config, milvus-server (and bench, when the
benchmarks are installed)."""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import entry_points
from itertools import islice
from typing import Any

from ragcache.errors import AuthenticationError, ConfigError, RagCacheError
from ragcache.retrieval.documents import FILTER_EXAMPLE

DEFAULT_URL = "http://127.0.0.1:8000"
LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]  # uvicorn's
# The top line of `ragcache --help`: plain text (the module docstring's markup would show as is).
DESCRIPTION = ("ragcache: a multi-level embedding cache and RAG retrieval service. "
               "Commands: serve, ingest, search, rerank, stats, config, milvus-server, and bench where installed.")
# The entry-point group through which other distributions add subcommands (benchmarks/pyproject.toml: bench).
COMMANDS_GROUP = "ragcache.commands"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        outcome = args.run(args)
    except RagCacheError as exc:
        print(f"error: {_in_cli_terms(exc, args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C is how a person stops `ragcache serve` (uvicorn re-raises it after its graceful shutdown) or a long
        # ingest: not a crash, no traceback. 130 is the shell's status for SIGINT.
        return 130
    # Benchmarks return their figures (already printed as a table); only an int is an exit status.
    return outcome if isinstance(outcome, int) else 0


def _in_cli_terms(exc: RagCacheError, args: argparse.Namespace) -> str:
    """The error as a person at the command line acts on it: a 401 names --api-key and RAGCACHE_API_KEY (the
    client's own message names Client(api_key=...), which this person never wrote)."""
    if isinstance(exc, AuthenticationError) and getattr(exc, "status_code", None) == 401:
        url = getattr(args, "url", "the service")
        if getattr(args, "api_key", None):
            return f"{url} refused the API key given (--api-key or RAGCACHE_API_KEY): check it"
        return f"{url} needs an API key: pass --api-key KEY or set RAGCACHE_API_KEY"
    return str(exc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragcache", description=DESCRIPTION)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    serve = commands.add_parser("serve", help="start the HTTP service")
    serve.add_argument("--host", default=None, help="default: RAGCACHE_HOST or 127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="default: RAGCACHE_PORT or 8000")
    serve.add_argument("--workers", type=int, default=1, help="worker processes sharing one port and one set of stores (default: 1)")
    serve.add_argument("--config", help="settings file (RAGCACHE_* lines, dotenv form)")
    serve.add_argument("--log-level", default="info", choices=LOG_LEVELS,
                       help="default: info; debug also shows the traceback of a start-up error")
    serve.add_argument("--insecure", action="store_true", help="allow a non-loopback address without API keys")
    serve.set_defaults(run=run_serve)

    for name, help_text in [("ingest", "add files to a collection"), ("search", "search a collection"),
                            ("rerank", "score texts against a query with the server's reranker"),
                            ("stats", "hit rates per level as a table (--watch: live)")]:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--url", default=os.environ.get("RAGCACHE_URL", DEFAULT_URL), help="the service's base URL")
        sub.add_argument("--api-key", default=os.environ.get("RAGCACHE_API_KEY"),
                         help="the service's API key (default: RAGCACHE_API_KEY); needed when the service has keys")
        if name == "ingest":
            sub.add_argument("path", help="a .txt/.md/.rst/.pdf/.html/.jsonl file, or a folder of them; a file skipped or unreadable "
                                          "is named on stderr, and exits 1 if one could not be read or nothing was ingested")
            sub.add_argument("--collection", required=True, help="the collection to add to (created on first use)")
            sub.add_argument("--chunk-chars", type=int, default=1200,
                             help="the longest chunk, in characters: paragraphs are merged up to it (default: 1200)")
            sub.add_argument("--batch", type=int, default=256, help="documents per request")
            sub.add_argument("--sync", action="store_true", help="then delete the documents this run did not send (admin key)")
            sub.add_argument("--scope", default=None, help="with --sync: a filter limiting what may be deleted")
            sub.add_argument("--quiet", action="store_true", help="no progress bar")
            sub.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                             help="embed and upsert from a Ray cluster's actors, straight into the stores of the settings "
                                  "(RAGCACHE_*; not through --url); ADDRESS as ray.init takes it (default: auto; docs/ray.md)")
            sub.add_argument("--actors", type=int, default=None, help="with --ray: actors in the pool (default: sized from the cluster)")
        elif name == "search":
            sub.add_argument("query", help="the question or text to search for")
            sub.add_argument("--collection", required=True, help="the collection to search")
            sub.add_argument("--top-k", type=int, default=5, help="hits to return (default: 5)")
            sub.add_argument("--filter", default=None, help=f"a Milvus boolean expression over the documents: {FILTER_EXAMPLE}")
            _add_search_options(sub)
            sub.add_argument("--rerank", action="store_true", help="reorder the top-k hits with the server's reranker")
            sub.add_argument("--rerank-top-n", type=int, default=None, help="hits kept after reranking (default: top-k)")
            sub.add_argument("--rerank-model", default=None, help="a served reranker (default: the server's first)")
        elif name == "rerank":
            sub.add_argument("query", help="the text the others are scored against")
            sub.add_argument("texts", nargs="+", help="the texts to score")
            sub.add_argument("--top-n", type=int, default=None, help="print the best n only")
            sub.add_argument("--model", default=None, help="a served reranker (default: the server's first)")
        elif name == "stats":
            sub.add_argument("--watch", action="store_true", help="refresh in place: live hit rates per level")
            sub.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (with --watch)")
            sub.add_argument("--count", type=int, default=None, help="stop after this many refreshes (with --watch)")
        sub.set_defaults(run=globals()[f"run_{name}"])

    config = commands.add_parser("config", help="the settings as this process resolves them, or their reference")
    config.add_argument("--config", help="settings file (RAGCACHE_* lines, dotenv form)")
    config.add_argument("--markdown", action="store_true", help="print the reference table of every setting")
    config.add_argument("--readme", metavar="PATH", help="rewrite the reference table between the markers in PATH")
    config.set_defaults(run=run_config)

    milvus = commands.add_parser("milvus-server", help="serve a Milvus Lite database to many processes (replicas) on loopback")
    milvus.add_argument("--db", required=True, help="the database file (.db), created when absent")
    milvus.add_argument("--port", type=int, default=19530, help="the loopback port to serve on (default: 19530)")
    milvus.set_defaults(run=run_milvus_server)

    for entry_point in entry_points(group=COMMANDS_GROUP):
        # A distribution adds a command by declaring a function that takes argparse's subparsers (the benchmarks
        # distribution declares `bench`): the shell names no package above it. One that fails to load is named and
        # left out, so a broken benchmarks install never takes `ragcache serve` down with it.
        try:
            entry_point.load()(commands)
        except Exception as exc:  # noqa: BLE001 - any failure of a foreign package's code
            print(f"warning: the {entry_point.name!r} command ({entry_point.value}) is left out: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
    return parser


SERVE_OPTIONS: dict[str, Any] = {
    "timeout_graceful_shutdown": 30,
    # uvicorn's default (5 s) closes idle keep-alive connections so soon that a client (or a load balancer,
    # whose idle timeout is often 60 s) reusing one at that instant gets a reset; the server must outlast them.
    "timeout_keep_alive": 75,
}


def run_serve(args) -> int:
    from ragcache.settings import Settings
    from ragcache_server.serving import ServeConfig, bounds_of, run_server
    from ragcache_server.start_logs import quiet_dependency_warnings, quiet_workers
    from ragcache_server.startup import serve_guard

    quiet_dependency_warnings()  # the shared stores may start here (--workers): their imports warn too
    quiet_workers()
    if args.config:
        os.environ["RAGCACHE_SETTINGS_FILE"] = args.config  # read again by each worker's app factory
    if args.insecure:
        os.environ["RAGCACHE_INSECURE"] = "true"  # read again by each worker's app factory
    settings = Settings.load(args.config)
    host = args.host or settings.service.host
    refusal = settings.access.bind_refusal(host)
    if refusal:
        raise ConfigError(refusal)
    if settings.levels.disk_path is None:
        # The disk level is on under `ragcache serve` (`make serve`), in the data folder; read again by each worker.
        os.environ["RAGCACHE_DISK_PATH"] = str(settings.levels.data_dir / "disk")
    port = args.port or settings.service.port
    # The data folder's lock and the port before anything starts (ragcache_server/startup.py): a second service
    # on the same folder or port is one line and starts nothing.
    with serve_guard(settings, host, port) as sock, shared_embedded_stores(settings, args.workers):
        run_server(ServeConfig(
            "ragcache_server.app:app_from_environment",
            factory=True,
            host=host,
            port=port,
            workers=args.workers,
            log_level=args.log_level,
            **bounds_of(settings.service, settings.access),
            **SERVE_OPTIONS,
        ), sock)
    return 0


def shared_embedded_stores(settings, workers: int):
    """The stores ``--workers N`` share, started once (``ragcache_server.startup.shared_embedded_stores``)."""
    from ragcache_server.startup import shared_embedded_stores as started_once

    return started_once(settings, workers)


def run_milvus_server(args) -> int:
    """Milvus Lite on 127.0.0.1:PORT until Ctrl-C or SIGTERM; replicas set RAGCACHE_MILVUS_URI to its URL."""
    import signal

    from ragcache.storage.embedded_milvus import MilvusLiteServer

    if not args.db.endswith(".db"):
        raise ConfigError(f"--db {args.db!r}: a Milvus Lite database is a path ending in .db")
    # SIGTERM (docker stop, systemd) ends the wait below like Ctrl-C, so the child milvus is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = MilvusLiteServer(args.db, port=args.port)
    print(f"Milvus Lite serving {server.db_path} at {server.url} (set RAGCACHE_MILVUS_URI={server.url})", flush=True)
    try:
        return server.process.wait()  # type: ignore[union-attr]
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _client(args):
    from ragcache.client import Client

    return Client(args.url, api_key=args.api_key)


def run_ingest(args) -> int:
    from ragcache.observe.progress import progress_bar
    from ragcache.retrieval.ingest import find_sources, read_documents

    if args.scope is not None and not args.sync:
        raise RagCacheError("--scope limits what --sync deletes: use it with --sync")
    if args.actors is not None and args.ray is None:
        raise RagCacheError("--actors sizes the pool of --ray: use it with --ray")
    if args.ray is not None:
        return run_ray_ingest(args)
    sources = find_sources(args.path)
    unreadable: list = []  # filled by read_documents as it meets them
    documents = read_documents(sources.files, unreadable, max_chars=args.chunk_chars)
    totals = dict.fromkeys(["received", "unchanged", "replaced", "added", "deleted", "computed"], 0)
    sent: set[str] = set()
    with _client(args) as client, progress_bar(unit="doc", desc=f"ingest -> {args.collection}", quiet=args.quiet) as progress:
        while batch := list(islice(documents, args.batch)):
            result = client.add_documents(args.collection, batch)
            sent.update(document["id"] for document in batch)
            for name, count in [("received", result.num_received), ("unchanged", result.num_unchanged),
                                ("replaced", result.num_replaced), ("added", result.num_inserted), ("computed", result.num_computed)]:
                totals[name] += count
            progress.update(len(batch))
        if args.sync and unreadable:
            # The documents of a file that could not be read this time would look gone from the source.
            print(f"--sync deleted nothing: {len(unreadable)} file(s) could not be read (below)", file=sys.stderr)
        elif args.sync:
            # Across many requests, "gone from the source" is every listed id that no batch sent.
            gone = [doc_id for doc_id in client.list_ids(args.collection, args.scope) if doc_id not in sent]
            for start in range(0, len(gone), args.batch):
                totals["deleted"] += client.delete_documents(args.collection, gone[start : start + args.batch])
    print(
        f"{totals['received']} documents in {args.collection!r}: {totals['unchanged']} unchanged, {totals['replaced']} replaced, "
        f"{totals['added']} added, {totals['deleted']} deleted ({totals['computed']} embeddings computed, the rest from cache)"
    )
    _print_skipped(sources.skipped + unreadable)
    if totals["received"] == 0 and (sources.files or sources.skipped):
        print(f"error: nothing was ingested from {args.path}: no file in it could be read as documents", file=sys.stderr)
        return 1
    return 1 if unreadable else 0


MAX_SKIPPED_SHOWN = 20  # past this, a count: a folder of 10,000 images should not print 10,000 lines


def _print_skipped(skipped: list) -> None:
    """Each file ingest did not read, and why, on stderr."""
    for file in skipped[:MAX_SKIPPED_SHOWN]:
        print(f"skipped {file.source}: {file.reason}", file=sys.stderr)
    if len(skipped) > MAX_SKIPPED_SHOWN:
        print(f"... and {len(skipped) - MAX_SKIPPED_SHOWN} more files skipped", file=sys.stderr)


def run_ray_ingest(args) -> int:
    """``ingest --ray``: the actors of a Ray cluster embed through the shared cache and upsert (ragcache.ray)."""
    try:
        import ray
    except ImportError as exc:
        raise RagCacheError("--ray needs the ray extra: pip install 'ragcache[ray]'") from exc
    from ragcache.ray import ingest_path
    from ragcache.settings import Settings

    ray.init(address=args.ray, log_to_driver=False)
    try:
        report = ingest_path(args.path, args.collection, chunk_chars=args.chunk_chars, settings=Settings.load(), sync=args.sync,
                             scope=args.scope, num_actors=args.actors, batch_size=args.batch, quiet=args.quiet)
    finally:
        ray.shutdown()
    print(
        f"{report.received} documents in {args.collection!r}: {report.unchanged} unchanged, {report.replaced} replaced, "
        f"{report.added} added, {report.deleted} deleted ({report.computed} embeddings computed, the rest from cache)"
    )
    return 0


def _add_search_options(sub) -> None:
    sub.add_argument("--mode", choices=["dense", "keyword", "hybrid"], default="dense",
                     help="dense: by embedding; keyword: BM25; hybrid: both, fused (default: dense)")
    sub.add_argument("--fusion", choices=["rrf", "weighted"], default="rrf", help="how hybrid fuses the two rankings")
    sub.add_argument("--rrf-k", type=int, default=60, help="reciprocal rank fusion's k: larger flattens the ranks (default: 60)")
    sub.add_argument("--dense-weight", type=float, default=0.5, help="weighted fusion: the dense share")
    sub.add_argument("--offset", type=int, default=0, help="hits (or groups) to skip: paging")
    sub.add_argument("--score-threshold", type=float, default=None, help="drop hits scoring below this")
    sub.add_argument("--mmr-lambda", type=float, default=None, help="MMR diversity (1: relevance only)")
    sub.add_argument("--group-by-source", action="store_true", help="at most --group-size hits per source file")
    sub.add_argument("--group-size", type=int, default=1, help="with --group-by-source: hits per source (default: 1)")


def run_search(args) -> int:
    from ragcache.retrieval.ranking import SearchOptions

    options = SearchOptions(
        mode=args.mode, fusion=args.fusion, rrf_k=args.rrf_k, dense_weight=args.dense_weight, offset=args.offset,
        score_threshold=args.score_threshold, mmr_lambda=args.mmr_lambda, group_by_source=args.group_by_source,
        group_size=args.group_size,
    )
    rerank = {"top_n": args.rerank_top_n, "model": args.rerank_model} if args.rerank else None
    if not args.rerank and (args.rerank_top_n is not None or args.rerank_model is not None):
        raise RagCacheError("--rerank-top-n and --rerank-model go with --rerank")
    with _client(args) as client:
        result = client.search(args.query, collection=args.collection, top_k=args.top_k, filter=args.filter, options=options, rerank=rerank)
    _print_hits(result, args.offset)
    if result.fallback:
        print(f"warning: {result.fallback}")
    if result.rerank_fallback:
        print(f"warning: {result.rerank_fallback}")
    elif result.reranked_by:
        print(f"(reranked by {result.reranked_by} in {result.timings_ms.rerank:.1f} ms)")
    print(f"({len(result.hits)} hits, {result.mode}; query embedding from {result.embedding_level}; {result.timings_ms.total:.1f} ms)")
    return 0


def _print_hits(result, offset: int) -> None:
    """One line a hit, numbered from ``offset + 1``; grouped by source under a numbered line a source."""
    def line(hit) -> str:
        return f"{hit.score:.4f}  {hit.id}  {' '.join(hit.text.split())[:100]}"

    if result.groups is None:
        for rank, hit in enumerate(result.hits, start=offset + 1):
            print(f"{rank:>2}. {line(hit)}")
        return
    by_id = {hit.id: hit for hit in result.hits}
    for rank, group in enumerate(result.groups, start=offset + 1):
        print(f"{rank:>2}. {group.source}")
        for doc_id in group.ids:
            print(f"      {line(by_id[doc_id])}")


def run_rerank(args) -> int:
    with _client(args) as client:
        result = client.rerank(args.query, args.texts, top_n=args.top_n, model=args.model)
    for rank, hit in enumerate(result.hits, start=1):
        print(f"{rank:>2}. {hit.score:.4f}  [{hit.index}]  {' '.join(args.texts[hit.index].split())[:100]}")
    print(f"(reranked by {result.model}; {result.num_cached} of {len(args.texts)} scores from cache)")
    return 0


def run_stats(args) -> int:
    from ragcache.observe.redact import redact_url
    from ragcache_cli.stats_view import render_stats, watch_stats

    if args.interval <= 0 or (args.count is not None and args.count < 1):
        raise RagCacheError("--interval must be > 0 and --count >= 1")
    with _client(args) as client:
        if not args.watch:
            print(render_stats(client.stats()))
            return 0
        try:
            watch_stats(client.stats, interval_s=args.interval, count=args.count, out=sys.stdout, title=f"ragcache {redact_url(args.url)}")
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a watch ends
    return 0


def run_config(args) -> int:
    from pathlib import Path

    from ragcache.settings import Settings
    from ragcache_cli.config_docs import effective_env_lines, markdown_table, replace_section

    if args.readme:
        path = Path(args.readme)
        try:
            path.write_text(replace_section(path.read_text(encoding="utf-8"), markdown_table()), encoding="utf-8")
        except OSError as exc:
            raise RagCacheError(f"cannot update {path}: {exc}") from exc
        print(f"configuration reference in {path} regenerated")
    elif args.markdown:
        print(markdown_table(), end="")
    else:
        settings = Settings.load(args.config)  # a value that does not parse: a one-line ConfigError
        print("\n".join(effective_env_lines(settings)))
        print(_compiled_line())
    return 0


def _compiled_line() -> str:
    """Which implementation of each C/Python pair serves in this install (``ragcache.observe.compiled``), as a
    comment line, so the output stays a settings file. Importing a pair's module is what chooses it."""
    import ragcache.tiers.lru_index  # noqa: F401
    import ragcache_server.embedding.answers  # noqa: F401
    from ragcache.observe.compiled import implementations

    return "# compiled loops: " + ", ".join(f"{name}={kind}" for name, kind in implementations().items())


if __name__ == "__main__":
    sys.exit(main())
