"""The registry's records: a prefix's name, what a caller registers and what is stored. What the registry answers
about them is in :mod:`.results` (warms, registrations, residency views) and :mod:`.stats` (its counters)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from ragcache.engines import PromptForm, Target
from ragcache.errors import InvalidInputError
from ragcache.retrieval.names import TenantName

__all__ = [
    "MAX_USES_PER_REPORT",
    "check_name",
    "PrefixName",
    "PromptForm",
    "Target",
    "PrefixSpec",
    "Prefix",
    "VolatileSpan",
    "content_hash",
]


# A name travels in URL paths (/prefixes/{name}), so it is limited to characters that need no escaping and
# cannot be a dot segment; fullmatch, because "$" would also accept a trailing newline.
MAX_NAME_CHARS = 128
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}")
# Uses one report may add (``POST /prefixes/{name}/uses``, ``PrefixRegistry.record_use``): a client reports what it
# rendered since its last report, far below this; one call adding a billion would only falsify the counters.
MAX_USES_PER_REPORT = 100_000


def check_name(name: object, field: str = "name") -> str:
    """``name`` when it is a valid prefix name; :class:`InvalidInputError` naming ``field`` otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInputError(f"{field} must be 1-{MAX_NAME_CHARS} of [A-Za-z0-9._-], starting with a letter or digit",
                                field=field)
    return name


@dataclass(frozen=True)
class PrefixName(TenantName):
    """A prefix's name as its caller knows it and as the store keeps it (``ragcache.retrieval.names``): a tenant's
    ``system`` is stored as ``<tenant>--system``. The registry takes one wherever it takes a name."""

    FIELD = "name"
    MAX_CHARS = MAX_NAME_CHARS

    @staticmethod
    def check(name: object, field: str) -> str:
        # The public name is checked, not the stored one: '-x' is no prefix name, though 'acme---x' would pass.
        return check_name(name, field)


@dataclass(frozen=True)
class PrefixSpec:
    """What a caller registers. ``text`` is a system prompt, or a template whose ``{slots}`` follow
    its constant head when ``is_template`` is set; the head is the prefix that is kept warm."""

    name: str
    text: str
    target: Target
    is_template: bool = False
    form: PromptForm = PromptForm.COMPLETION
    lmcache_controller_url: str | None = None
    pinned: bool = True
    # More vLLM replicas (base URLs) serving ``target.model``: the prefix is kept warm on each of them.
    endpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prefix:
    """A registered prefix, as stored (in Redis or the local file) and shared by every replica."""

    name: str
    text: str
    target: Target
    is_template: bool
    form: PromptForm
    lmcache_controller_url: str | None
    pinned: bool
    version: int
    # Tokens of the constant head; None until a tokenizer or vLLM could count them.
    num_tokens: int | None
    content_hash: str
    created_at: float
    updated_at: float
    # Replicas beside ``target`` (absent in records stored before fleets existed).
    endpoints: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the storage format)."""
        out = dataclasses.asdict(self)
        out["form"] = self.form.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Prefix:
        """Inverse of :meth:`to_json`; keys it does not know are left out (``GET /prefixes/{name}`` adds
        ``residency``, and a later version may store more)."""
        known = {field.name for field in dataclasses.fields(Prefix)}
        fields = {key: value for key, value in data.items() if key in known}
        fields["target"] = Target(**fields["target"])
        fields["form"] = PromptForm(fields["form"])
        fields["endpoints"] = tuple(fields.get("endpoints") or ())
        return cls(**fields)


def content_hash(text: str, target: Target, is_template: bool, form: PromptForm) -> str:
    """BLAKE2b-128 over everything that changes what vLLM caches; a change means a new version. Not xxh3: a
    tenant's text chooses it, and a chosen collision would pass a changed prefix off as the version warmed."""
    h = hashlib.blake2b(digest_size=16)
    for part in (target.base_url, target.model, form.value, "T" if is_template else "S", text):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


@dataclass(frozen=True)
class VolatileSpan:
    """Content inside a prefix that changes from request to request and so defeats caching."""

    kind: str
    start: int
    end: int
    text: str

    def message(self) -> str:
        """A warning that names the span."""
        return f"volatile {self.kind} {self.text!r} at characters {self.start}-{self.end}"
