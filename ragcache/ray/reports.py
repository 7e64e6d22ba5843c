"""What one run did, as frozen dataclasses: built by the driver from what the actors returned (their output
rows), so a batch retried after its actor died is counted once, as the attempt that returned."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import xxhash

__all__ = ["EmbedReport", "IngestReport", "EmbedTally"]

COMPUTE = "compute"


@dataclass(frozen=True)
class EmbedReport:
    """``texts``: rows embedded; ``distinct``: distinct texts among them; ``computed``: texts the model (or the
    upstream) computed, across all actors; ``served``: rows per level that served them (``compute`` included).
    With single flight each distinct text is computed at most once per space: ``computed <= distinct``.
    Remote models: ``tokens_saved`` are the tokens of the rows a level served (not sent upstream), and
    ``money_saved`` those at the model's ``price_per_million_tokens`` (None without a price or for a local model)."""

    texts: int
    distinct: int
    computed: int
    served: dict[str, int] = field(default_factory=dict)
    tokens_saved: int | None = None
    money_saved: float | None = None
    wall_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        return 1 - self.computed / self.texts if self.texts else 0.0


class EmbedTally:
    """Adds up output batches of ``CachedEmbedder`` into an ``EmbedReport``. Distinct texts are counted by a
    64-bit hash each (about 60 bytes of driver memory per distinct text: 60 MB for a million)."""

    def __init__(self, *, price_per_million_tokens: float | None = None):
        self.price = price_per_million_tokens
        self.served: Counter[str] = Counter()
        self.hashes: set[int] = set()
        self.tokens_saved: int | None = None

    def add(self, texts: Iterable[str], levels: Iterable[str], tokens: Iterable[int] | None = None) -> None:
        levels = list(levels)
        self.served.update(levels)
        self.hashes.update(xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass")) for text in texts)
        if tokens is not None:
            saved = sum(int(count) for count, level in zip(tokens, levels) if level != COMPUTE)
            self.tokens_saved = (self.tokens_saved or 0) + saved

    def report(self, wall_s: float = 0.0) -> EmbedReport:
        money = None if self.price is None or self.tokens_saved is None else round(self.tokens_saved * self.price / 1e6, 6)
        return EmbedReport(texts=sum(self.served.values()), distinct=len(self.hashes), computed=self.served[COMPUTE],
                           served=dict(self.served), tokens_saved=self.tokens_saved, money_saved=money, wall_s=wall_s)


@dataclass(frozen=True)
class IngestReport:
    """One ingest: documents received, left alone (same content hash), added, replaced and deleted (a sync's
    cleanup), embeddings computed, and the levels that served the embeddings of the documents that changed.
    ``written`` (added + replaced + deleted) is 0 for a re-run of a source that did not change."""

    collection: str
    received: int
    unchanged: int
    added: int
    replaced: int
    deleted: int
    computed: int
    served: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def written(self) -> int:
        return self.added + self.replaced + self.deleted

    @classmethod
    def of(cls, collection: str, rows: Iterable[Mapping], *, deleted: int = 0, wall_s: float = 0.0) -> IngestReport:
        """The sum of ``DocumentWriter``'s rows (one per batch; ``served`` already parsed into a mapping)."""
        totals: Counter[str] = Counter()
        served: Counter[str] = Counter()
        for row in rows:
            for name in ("num_received", "num_unchanged", "num_added", "num_replaced", "num_computed"):
                totals[name] += int(row[name])
            served.update(row["served"])
        return cls(collection, totals["num_received"], totals["num_unchanged"], totals["num_added"], totals["num_replaced"],
                   deleted, totals["num_computed"], dict(served), wall_s)
