"""What the library shows of itself: spans (``tracing``), progress bars on stderr (``progress``), the masking
that keeps secrets out of every log line, error and repr (``redact``) and the filter that keeps a repeated warning
from flooding the log (``logs``), and which implementation of each compiled C/Python pair serves (``compiled``).

Kept import-light, the HTTP client uses it: each name is imported on first use (``progress`` pulls in tqdm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache.observe.exports import lazy_exports

_EXPORTS = {
    ".tracing": ("Tracing", "span"),
    ".progress": ("progress_bar",),
    ".redact": ("redact_text", "redact_url"),
    ".logs": ("DropMessages", "RepeatedWarnings"),
    ".compiled": ("CompiledPair", "choose", "implementations"),
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ragcache.observe.compiled import CompiledPair, choose, implementations
    from ragcache.observe.logs import DropMessages, RepeatedWarnings
    from ragcache.observe.progress import progress_bar
    from ragcache.observe.redact import redact_text, redact_url
    from ragcache.observe.tracing import Tracing, span
