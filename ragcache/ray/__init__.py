"""Bulk embedding and ingest on a Ray cluster, through the shared cache (the ``ray`` extra; docs/ray.md).

Ray Data runs ``CachedEmbedder`` / ``DocumentWriter`` in an actor pool; each actor opens the embedding cache
of the settings once (its own L1; L2, L3, the single-flight locks and the knowledge base shared with every
other actor and service replica), so a text is computed once per space across the cluster and a re-run of
an unchanged corpus computes nothing.

    embed_dataset(ds, "text", settings=...)        # a Dataset with an "embedding" column (lazy)
    embed_report(materialized, "text")              # EmbedReport: texts, distinct, computed, served per level
    ingest_dataset(ds, "docs", settings=..., sync=True)   # IngestReport: added, replaced, unchanged, deleted
    ingest_path("corpus/", "docs", settings=...)    # what `ragcache ingest corpus/ --collection docs --ray` runs

Importing this package does not import Ray; the functions that need it do.
"""

from ragcache.ray.actors import LEVEL_COLUMN, TOKENS_COLUMN, CachedEmbedder, DocumentWriter, open_model_cache
from ragcache.ray.pipeline import cluster_plan, embed_dataset, embed_report, ingest_dataset, ingest_path, read_documents
from ragcache.ray.plan import ActorPlan, plan_actors
from ragcache.ray.reports import EmbedReport, IngestReport

__all__ = [
    "LEVEL_COLUMN",
    "TOKENS_COLUMN",
    "ActorPlan",
    "CachedEmbedder",
    "DocumentWriter",
    "EmbedReport",
    "IngestReport",
    "cluster_plan",
    "embed_dataset",
    "embed_report",
    "ingest_dataset",
    "ingest_path",
    "open_model_cache",
    "plan_actors",
    "read_documents",
]
