"""Whether an endpoint's KV events are believed: what they claim is checked now and then by a real warm.

Whoever binds an event address is believed by the subscriber (issue 38, item 5): forged ``BlockStored`` events made a
prefix read resident, stopped its warms and drew routes while the engine held nothing. A warm is the engine's own
answer: the cached tokens it reports cannot be forged by the publisher. So every warm sent where the events report a
prefix's blocks is a check (a due warm is sent as one, ``verify_interval_s`` after the endpoint's last check, even
while the events show the prefix whole), and an endpoint whose events claim blocks that ``untrust_after`` checks in a
row did not find is **untrusted** for ``untrusted_s``: its events are ignored (residency ``untrusted``, warms on the
timer, no route by them), shown in ``/prefixes`` and ``/metrics``. Checks in a row, because an honest engine can evict a
block between the moment the events were read and the warm's prefill (a race of milliseconds, not of every check).
Events that under-claim (a warm finds more cached than they say) cost warms only and are not counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["EventsTrust", "claim_checked"]

log = logging.getLogger(__name__)


@dataclass
class EventsTrust:
    """One endpoint's record of checks (owned by :class:`~.engine_view.EngineView`, under its lock)."""

    num_checks: int = 0
    num_disagreements: int = 0
    in_a_row: int = 0
    untrusted_until: float | None = None
    last_checked_at: float = float("-inf")

    def trusted(self, now: float) -> bool:
        if self.untrusted_until is not None and now >= self.untrusted_until:
            self.untrusted_until, self.in_a_row = None, 0  # trusted again: checks resume
        return self.untrusted_until is None

    def record(self, agrees: bool, now: float, untrust_after: int, untrusted_s: float, url: str) -> None:
        self.num_checks += 1
        self.last_checked_at = now
        if agrees:
            self.in_a_row = 0
            return
        self.num_disagreements += 1
        self.in_a_row += 1
        if self.in_a_row >= untrust_after and self.untrusted_until is None:
            self.untrusted_until = now + untrusted_s
            log.warning("KV events of %s claimed blocks that %d warms in a row did not find: its events are ignored "
                        "for %.0fs (is someone else bound to its event address?)", url, self.in_a_row, untrusted_s)


def claim_checked(resident_blocks: int, num_prompt_tokens: int, num_cached_tokens: int, block_size: int) -> bool:
    """Whether a warm that found ``num_cached_tokens`` of its ``num_prompt_tokens`` cached bears out events that
    claimed ``resident_blocks`` of its leading blocks (of ``block_size`` tokens). vLLM always computes a prompt's last
    token, so a block ending there is never reported cached."""
    expected = min(resident_blocks, (num_prompt_tokens - 1) // block_size)
    return num_cached_tokens // block_size >= expected
