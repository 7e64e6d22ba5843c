"""The driver's side: build the Ray Data pipelines, size their actor pools, and add up what they did.

    >>> embedded = embed_dataset(ray.data.read_parquet("chunks/"), "text", settings=settings)   # lazy
    >>> report = ingest_dataset(ray.data.read_json("docs.jsonl"), "docs", settings=settings)   # runs it

Ray is imported inside the functions: ``ragcache`` stays importable where Ray is not installed.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragcache.errors import NotFoundError
from ragcache.models.remote import load_models
from ragcache.observe.progress import progress_bar
from ragcache.ray.actors import LEVEL_COLUMN, TOKENS_COLUMN, CachedEmbedder, DocumentWriter
from ragcache.ray.plan import ActorPlan, plan_actors
from ragcache.ray.reports import EmbedReport, EmbedTally, IngestReport
from ragcache.retrieval.ingest import file_documents, source_files
from ragcache.settings import Settings

if TYPE_CHECKING:
    from ray.data import Dataset

__all__ = ["actor_settings", "cluster_plan", "embed_dataset", "embed_report", "ingest_dataset", "ingest_path", "read_documents"]

DELETE_BATCH = 256


def cluster_plan(settings: Settings, model: str | None = None, *, num_actors: int | None = None,
                 batch_size: int | None = None) -> ActorPlan:
    """The actor plan for the connected Ray cluster's CPUs and GPUs and the model (local or remote)."""
    import ray

    resources = ray.cluster_resources()
    return plan_actors(cluster_cpus=resources.get("CPU", 0), cluster_gpus=resources.get("GPU", 0),
                       remote=_remote_price(settings, model) is not None, device=settings.space.device,
                       num_actors=num_actors, batch_size=batch_size)


def embed_dataset(ds: Dataset, text_column: str, *, model: str | None = None, settings: Settings | None = None,
                  output_column: str = "embedding", num_actors: int | None = None, batch_size: int | None = None) -> Dataset:
    """``ds`` with ``output_column`` (each row's vector of ``text_column``, through the shared cache) and
    ``embedding_level`` (the level that served it); for a remote model also ``embedding_tokens``. Lazy, as
    Ray Data is: nothing runs until the dataset is consumed. ``embed_report`` adds up a consumed one."""
    settings = settings or Settings.load()
    plan = cluster_plan(settings, model, num_actors=num_actors, batch_size=batch_size)
    return _map_with_actors(ds, CachedEmbedder, plan, (settings, text_column), {"model": model, "output_column": output_column})


def embed_report(embedded: Dataset, text_column: str, *, model: str | None = None, settings: Settings | None = None,
                 wall_s: float = 0.0) -> EmbedReport:
    """What an embedding run did, read from its output (materialize it first: reading a lazy dataset here
    would run the pipeline again). Only the text, level and token columns travel to the driver."""
    settings = settings or Settings.load()
    columns = [text_column, LEVEL_COLUMN]
    remote = _remote_price(settings, model)
    if remote is not None:
        columns.append(TOKENS_COLUMN)
    tally = EmbedTally(price_per_million_tokens=remote[1] if remote is not None else None)
    for batch in embedded.select_columns(columns).iter_batches(batch_format="numpy"):
        tally.add(batch[text_column].tolist(), batch[LEVEL_COLUMN].tolist(), batch[TOKENS_COLUMN].tolist() if remote else None)
    return tally.report(wall_s)


def read_documents(path: str | Path, *, chunk_chars: int = 1200) -> Dataset:
    """The documents of a file or folder as ``ragcache ingest`` reads them (.txt/.md/.rst chunked, .jsonl a
    document a line), read and chunked by Ray tasks: the path must be readable on every node."""
    import ray

    files = [{"path": str(file.absolute()), "source": name} for file, name in source_files(path)]

    def documents(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"id": document["id"], "text": document["text"], "metadata": json.dumps(document["metadata"])}
                for document in file_documents(Path(row["path"]), row["source"], max_chars=chunk_chars)]

    return ray.data.from_items(files).flat_map(documents)


def ingest_dataset(ds: Dataset, collection: str, *, model: str | None = None, settings: Settings | None = None,
                   sync: bool = False, scope: str | None = None, num_actors: int | None = None, batch_size: int | None = None,
                   quiet: bool = False, after_batch: Callable[[], None] | None = None) -> IngestReport:
    """Embed and upsert every document of ``ds`` (columns ``id``, ``text``, optionally ``metadata``) into
    ``collection`` from an actor pool, with ``ingest --sync``'s semantics: a document stored with the same
    content hash is left alone; with ``sync``, documents of the collection (within ``scope``, a filter) that
    ``ds`` did not hold are deleted afterwards. Runs the pipeline; a progress bar on stderr unless ``quiet``."""
    settings = settings or Settings.load()
    plan = cluster_plan(settings, model, num_actors=num_actors, batch_size=batch_size)
    started = time.perf_counter()
    written = _map_with_actors(ds, DocumentWriter, plan, (settings, collection), {"model": model, "after_batch": after_batch})
    rows, sent = [], set()
    with progress_bar(desc=f"ingest -> {collection} (ray)", unit="doc", quiet=quiet) as progress:
        for row in written.iter_rows():
            row = dict(row)
            sent.update(json.loads(row.pop("ids")))
            rows.append({**row, "served": json.loads(row["served"])})
            progress.update(int(row["num_received"]))
    deleted = _delete_unsent(settings, collection, sent, scope) if sync else 0
    return IngestReport.of(collection, rows, deleted=deleted, wall_s=time.perf_counter() - started)


def ingest_path(path: str | Path, collection: str, *, chunk_chars: int = 1200, **options) -> IngestReport:
    """``ingest_dataset`` over ``read_documents(path)``: what ``ragcache ingest PATH --ray`` runs."""
    return ingest_dataset(read_documents(path, chunk_chars=chunk_chars), collection, **options)


# The options an actor never uses that hold secrets: the service's API keys and the reranker's key. They are
# left out of what travels (Ray's object store, the actors' logs); the stores' and providers' credentials stay,
# since the actors write to those stores and call those providers.
_NOT_FOR_ACTORS = {"api_key": None, "api_keys": None, "api_keys_file": None, "rerank_api_key": None}


def actor_settings(settings: Settings) -> Settings:
    """What the actors are sent: ``settings`` without the secrets an actor never uses."""
    return settings.replace(**_NOT_FOR_ACTORS)


def _map_with_actors(ds: Dataset, actor: type, plan: ActorPlan, arguments: tuple, keywords: dict) -> Dataset:
    settings, *rest = arguments
    arguments = (actor_settings(settings), *rest)
    with warnings.catch_warnings():
        # The retry and spread arguments are free remote arguments in Ray 2.60, which warns of them (ActorPlan).
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return ds.map_batches(actor, fn_constructor_args=arguments, fn_constructor_kwargs=keywords, batch_format="numpy",
                              **plan.ray_arguments())


def _delete_unsent(settings: Settings, collection: str, sent: set[str], scope: str | None) -> int:
    """A sync's cleanup across many batches, as ``ragcache ingest --sync`` does it: every listed id that no
    batch held is gone from the source."""
    from ragcache.retrieval.knowledge import KnowledgeBase
    from ragcache.storage.stores import Stores

    stores = Stores.open(settings)
    try:
        if stores.milvus is None:
            return 0
        knowledge = KnowledgeBase(stores.milvus, redis=stores.redis, keyword_index=settings.knowledge.keyword_index)
        try:
            listed = knowledge.list_ids(collection, scope)
        except NotFoundError:
            return 0  # nothing was ever ingested: nothing to delete
        gone = [doc_id for doc_id in listed if doc_id not in sent]
        return sum(knowledge.delete_documents(collection, gone[start : start + DELETE_BATCH])
                   for start in range(0, len(gone), DELETE_BATCH))
    finally:
        stores.close()


def _remote_price(settings: Settings, model: str | None) -> tuple[str, float | None] | None:
    """(name, price per million tokens) when ``model`` names a remote model of the settings; None when local."""
    name = model or settings.space.model
    for configured in load_models(settings.space.models_json, settings.space.models_file):
        if configured.name == name:
            return name, configured.price_per_million_tokens
    return None

