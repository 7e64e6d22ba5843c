"""The knowledge base's one way into Milvus: every call behind a circuit breaker, its failures converted.

What a failing Milvus raises, and how it reads in one line, come from ``ragcache.storage.milvus_errors`` (shared with
the L3 level); here a failure becomes the knowledge base's error: ``NotFoundError`` for an unknown collection,
``InvalidInputError`` for a filter Milvus cannot parse, ``TierUnavailableError`` for Milvus failing.
"""

from __future__ import annotations

import logging
from typing import Any

from pymilvus import MilvusClient

from ragcache.core.health import TierHealth
from ragcache.errors import InvalidInputError, NotFoundError, RagCacheError, TierUnavailableError
from ragcache.retrieval.documents import FILTER_EXAMPLE
from ragcache.storage.milvus_errors import is_milvus_outage, milvus_error_message, milvus_failures

__all__ = ["MilvusGateway", "STORE", "converted"]

STORE = "knowledge"

log = logging.getLogger(__name__)


class MilvusGateway:
    """One Milvus client (``Stores.milvus``) and the breaker of Milvus as the knowledge base's store."""

    def __init__(self, milvus: MilvusClient):
        self.milvus = milvus
        self.health = TierHealth()

    def call(self, method: str, *args, collection: str | None, filter_given: bool = False, **kwargs) -> Any:
        """Call the Milvus client's ``method`` behind the circuit breaker, converting its failures.

        A failure of Milvus itself (refused, timed out: the client gives every call a deadline) opens the
        breaker, and until a probe succeeds the knowledge base answers at once with ``TierUnavailableError``
        rather than making each request wait out the deadline. An answer that is an error status (no such
        collection, a bad filter, an engine error) is Milvus working: it closes the breaker."""
        if not self.health.should_try():
            raise TierUnavailableError(STORE, f"Milvus is down (retry when it is back): {self.health.last_error}")
        try:
            result = getattr(self.milvus, method)(*args, **kwargs)
        except milvus_failures as exc:
            error = converted(exc, collection, filter_given=filter_given)
            # Only no answer opens the breaker: an error status (e.g. an engine error on an odd filter, which
            # the service then tells apart by searching without it) came from a Milvus that is up.
            self._note(error if is_milvus_outage(exc) else None)
            raise error from exc
        except TierUnavailableError as exc:  # a server client that cannot connect (stores.MilvusConnection)
            self._note(exc)
            raise
        self._note(None)
        return result

    def next_page(self, iterator: Any, collection: str, filter_given: bool) -> list[dict]:
        """A query iterator's next page, its failures converted and counted like any Milvus call's."""
        try:
            batch = iterator.next()
        except milvus_failures as exc:
            error = converted(exc, collection, filter_given=filter_given)
            self._note(error)
            raise error from exc
        self._note(None)
        return batch

    def _note(self, error: RagCacheError | None) -> None:
        if isinstance(error, TierUnavailableError):
            if self.health.record_failure(error):
                log.warning("the knowledge base's Milvus is down; requests get 503 until it is back: %s", error)
        elif self.health.record_success():
            log.warning("the knowledge base's Milvus is back")


def converted(exc: BaseException, name: str | None, *, filter_given: bool = False) -> RagCacheError:
    """The knowledge base's error for a Milvus failure on collection ``name`` (None: no collection)."""
    code = getattr(exc, "code", None)
    message = milvus_error_message(exc)
    if name is not None and (code == 100 or "collection not found" in message.lower()):
        return NotFoundError(f"collection {name!r} does not exist", field="collection")
    # Milvus answers a filter it cannot parse or type-check with 1100 (invalid parameter) or a message
    # about the expression; anything else (unreachable, timed out, ...) is the store failing.
    if filter_given and (code == 1100 or "expr" in message.lower()):
        return InvalidInputError(f"filter is not a valid Milvus expression ({message.strip()}); a filter reads like "
                                 f"{FILTER_EXAMPLE}", field="filter")
    where = "" if name is None else f" on collection {name!r}"
    return TierUnavailableError(STORE, f"Milvus failed{where} (retry when it is back): {message}")
