"""Cache keys: an embedding space plus a hash of the exact text.

A key names one vector exactly. The *space* holds everything that can change the output vector (model,
revision, dtype, dimension, normalisation, max sequence length, prompt, explicit text normalisation) and
nothing that cannot; the *text hash* is BLAKE2b-128 of the exact UTF-8 bytes. The key is
``rc:<space_id>:<text_hash>``, the same in every process and on every machine.

Why a cryptographic hash: a caller chooses the text, and a key that two texts share serves one caller the vector
of the other. XXH3 (the hash of key format 1) is not collision-resistant against chosen input: two 400-byte texts
with one xxh3-128 were built from its public secret (docs/SECURITY.md). BLAKE2b-128 has no known shortcut: a
collision costs about 2**64 hashes. ``identity_hash`` is the same hash for every other identity a caller's text
chooses (rerank pairs, search results, documents, prefix versions). The key format is part of every space's
description (``KEY_FORMAT``), so entries written under format 1 are never looked up by a format-2 key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import threading
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import cast

import numpy as np
import xxhash

from ragcache.errors import InvalidInputError, InvalidTextError

__all__ = ["DTYPES", "KEY_FORMAT", "EmbeddingSpace", "Generation", "KeyList", "KeyMemo", "identity_hash", "key_digests",
           "text_hash", "text_hashes"]

KEY_PREFIX = "rc"
# 2: text hashes are BLAKE2b-128 (1: xxh3-128, which chosen texts can collide). In every space's description, so a
# new format is a new space id: no entry of an older format is ever read under a key of this one.
KEY_FORMAT = 2
TEXT_HASH_BYTES = 16
DTYPES = ("float32", "float16", "bfloat16")
TEXT_NORMALIZATIONS = (None, "NFC", "NFKC")
# Fields added after space ids were in use: absent from the description when unset, so ids stay the same.
_OMITTED_WHEN_NONE = ("namespace", "provider", "endpoint", "prompt_name", "backend")


@dataclass(frozen=True)
class EmbeddingSpace:
    """Everything that determines the vector a text maps to."""

    model: str
    revision: str
    dtype: str
    dim: int
    normalize: bool
    max_seq_length: int
    prompt: str | None = None
    # Explicit, opt-in text normalisation (Unicode NFC/NFKC). Never applied silently: it changes the key.
    text_normalization: str | None = None
    # A tenant's own cache namespace (services' tenant_cache_namespaces): the same vectors under other keys,
    # so one tenant's entries never serve another. Left out of the description when None, so that adding
    # it changed no existing space id.
    namespace: str | None = None
    # The model's generation under this description: bumped when the drift check (ragcache.models.drift) finds
    # that the model behind the same name and revision now computes other vectors, so keys of the old model
    # are never looked up again. Left out of the description when 0, so no existing space id changed.
    generation: int = 0
    # A remote model (ragcache.models.remote): the provider kind ("openai", "tei", "ollama"), the endpoint's
    # identity (scheme://host:port/path of its base URL, never credentials; or a name the operator gives two
    # deployments that serve one model), and TEI's server-side prompt name. ``model`` is then the upstream's
    # model id. Left out of the description when None, like ``namespace``: local space ids did not change.
    provider: str | None = None
    endpoint: str | None = None
    prompt_name: str | None = None
    # A local model run by another engine than torch (ragcache.models.onnx: "onnx", "onnx-int8"): its bits
    # differ from torch's, so it is a space of its own. Left out when None: torch's space ids did not change.
    backend: str | None = None
    space_id: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidInputError(f"dtype must be one of {DTYPES}, got {self.dtype!r}", field="dtype")
        if self.dim <= 0 or self.max_seq_length <= 0:
            raise InvalidInputError("dim and max_seq_length must be positive", field="dim")
        if self.generation < 0:
            raise InvalidInputError("generation must be 0 or more", field="generation")
        if self.text_normalization not in TEXT_NORMALIZATIONS:
            raise InvalidInputError(
                f"text_normalization must be one of {TEXT_NORMALIZATIONS}", field="text_normalization"
            )
        # 64 bits, 16 hex characters as before; BLAKE2b like the text hash, since a tenant's namespace and a
        # named prompt's text are in the description too.
        space_id = hashlib.blake2b(self.canonical().encode(), digest_size=8).hexdigest()
        object.__setattr__(self, "space_id", space_id)

    def canonical(self) -> str:
        """The canonical description the space id is hashed from (sorted JSON, no space id)."""
        description = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        description["key_format"] = KEY_FORMAT
        for name in _OMITTED_WHEN_NONE:
            if description[name] is None:
                del description[name]
        if self.generation == 0:
            del description["generation"]
        return json.dumps(description, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    def describe(self) -> dict:
        """The space as a plain dict, space id included, for stats and /info."""
        return {"space_id": self.space_id, **json.loads(self.canonical())}

    def prepare(self, texts: Sequence[str]) -> list[str]:
        """Apply the space's explicit text normalisation (the identity when there is none)."""
        if self.text_normalization is None:
            return list(texts)
        return [unicodedata.normalize(self.text_normalization, text) for text in texts]  # type: ignore[arg-type]

    def keys(self, texts: Sequence[str]) -> KeyList:
        """One key per text, in order. Texts must already be ``prepare``d."""
        prefix = f"{KEY_PREFIX}:{self.space_id}:"
        return KeyList([prefix + digest for digest in text_hashes(texts)])


class KeyMemo:
    """The keys of texts keyed recently, so that a text asked for again (an L1 hit's, the common case of a cache) is
    not hashed again: a dict lookup of the text costs a fifth of its BLAKE2b and its L1 digest. Exact by construction:
    the dict compares whole texts, and an entry names the space it was keyed in.

    Bounded: at most ``max_entries`` texts of at most ``max_text_chars`` characters (a longer text is keyed as
    usual, never kept: its hash is a small part of its request), the oldest quarter dropped when full. Lookups take
    no lock (a dict read is atomic); filling and dropping take one per request.
    """

    def __init__(self, max_entries: int = 32_768, max_text_chars: int = 512):
        self.max_entries = max_entries
        self.max_text_chars = max_text_chars
        self._entries: dict[str, tuple[str, str, bytes]] = {}  # text -> (space id, key, its L1 digest)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self, space: EmbeddingSpace, texts: Sequence[str]) -> KeyList:
        """``space.keys(texts)`` with the L1 digests made, each text hashed only when it is not remembered."""
        # map/itemgetter: the loops over the texts run in C (this is every L1 hit's first step).
        try:
            found = list(map(self._entries.get, texts))
        except TypeError:  # an item that is not even hashable: _fill's keying names it
            return self._fill(space, texts, None)
        if None in found:
            return self._fill(space, texts, found)
        remembered = cast(list[tuple[str, str, bytes]], found)
        if set(map(_SPACE_OF, remembered)) != {space.space_id}:
            return self._fill(space, texts, found)
        return KeyList(map(_KEY_OF, remembered), _digest_array(list(map(_DIGEST_OF, remembered)), len(remembered)))

    def _fill(self, space: EmbeddingSpace, texts: Sequence[str], found: list | None) -> KeyList:
        keys = space.keys(texts)  # validates the texts (an InvalidInputError names the first bad one)
        digests = keys.digests()
        rows = digests.tobytes()
        space_id, limit = space.space_id, self.max_text_chars
        new = {text: (space_id, key, rows[16 * i : 16 * i + 16]) for i, (text, key) in enumerate(zip(texts, keys))
               if len(text) <= limit and (found is None or found[i] is None or found[i][0] != space_id)}
        if new:
            with self._lock:
                if len(self._entries) + len(new) > self.max_entries:
                    for text in list(itertools.islice(self._entries, max(len(new), self.max_entries // 4))):
                        del self._entries[text]  # insertion order: the oldest first
                self._entries.update(itertools.islice(new.items(), self.max_entries))
        return keys


# A memo entry's fields: (space id, key, its L1 digest).
_SPACE_OF, _KEY_OF, _DIGEST_OF = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


class KeyList(list):
    """A request's keys (strings, as the shared levels store them), with their L1 digests made at most once.

    The walk hands the same keys to every level and to the model batcher; L1 identifies a key by a digest of
    it (``ragcache.tiers.lru_index``). Made once per request and carried through the walk (``take`` keeps the
    rows of a subset), a key is hashed once however many times L1 is asked about it (probe, lookup, peek, store).
    """

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str] = (), digests: np.ndarray | None = None):
        super().__init__(keys)
        self._digests = digests

    def digests(self) -> np.ndarray:
        """``[n, 2]`` uint64: the keys' xxh3-128 digests (``key_digests``), computed on first use."""
        if self._digests is None:
            self._digests = _digests_of(self)
        return self._digests

    def take(self, positions: Sequence[int] | np.ndarray) -> KeyList:
        """The keys at ``positions``, in that order, with their digests if they were made."""
        digests = None if self._digests is None else self._digests[positions]
        index = positions.tolist() if isinstance(positions, np.ndarray) else positions  # Python ints index the list fastest
        return KeyList([self[i] for i in index], digests)


def key_digests(keys: Sequence[str]) -> np.ndarray:
    """The xxh3-128 digests of ``keys`` as an ``[n, 2]`` uint64 array (two words; L1 probes from the second).
    A ``KeyList`` keeps its own, made once."""
    return keys.digests() if isinstance(keys, KeyList) else _digests_of(keys)


def _digest_array(digests: list[bytes], count: int) -> np.ndarray:
    return np.frombuffer(b"".join(digests), dtype=np.uint64).reshape(count, 2)


def _digests_of(keys: Sequence[str]) -> np.ndarray:
    # xxh3 is safe here, unlike for the text: a key is the space id and a BLAKE2b digest, bytes no caller chooses,
    # so a collision of two keys' xxh3 costs the generic 2**64 tries, and xxh3 costs a sixth of BLAKE2b a key.
    digest = xxhash.xxh3_128_digest
    # Native byte order, no copy: which word is "high" does not matter as long as it is always the same.
    return _digest_array([digest(key.encode("utf-8", "surrogatepass")) for key in keys], len(keys))


class Generation:
    """The generation a model's cache embeds under (``ragcache.models.drift``); one object shared by the cache, its
    views (every scope) and the model's drift guard, so one assignment moves them all. An int assignment is atomic:
    no lock is needed to read it."""

    def __init__(self, value: int = 0):
        self.value = value

    def __repr__(self) -> str:
        return f"Generation({self.value})"


def identity_hash(data: bytes) -> str:
    """BLAKE2b-128 of ``data`` as 32 hex characters: the hash of every identity a caller's text chooses, where a
    chosen collision would let one caller's entry answer for another's (see the module docstring)."""
    return hashlib.blake2b(data, digest_size=TEXT_HASH_BYTES).hexdigest()


def text_hash(text: str) -> str:
    """BLAKE2b-128 of the exact UTF-8 bytes of ``text``, as 32 hex characters."""
    return text_hashes([text])[0]


def text_hashes(texts: Sequence[str]) -> list[str]:
    """Hash many texts; raises ``InvalidInputError`` naming the first item that is not a usable string."""
    blake2b = hashlib.blake2b
    try:
        # The fast path: one comprehension, no per-item checks (the common case is all valid). ~0.3 us a short
        # text here against xxh3's 0.05: the price of keys no caller can collide.
        return [blake2b(text.encode("utf-8"), digest_size=TEXT_HASH_BYTES).hexdigest() for text in texts]
    except (AttributeError, UnicodeEncodeError):
        pass
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(
                f"item {index} is {type(text).__name__}, expected a string", field=f"inputs[{index}]"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidTextError(
                f"item {index} is not valid Unicode: {exc.reason} at character {exc.start} "
                f"({text[exc.start]!r}); lone surrogates cannot be encoded as UTF-8",
                index=index,
                field=f"inputs[{index}]",
            ) from exc
    raise AssertionError("unreachable: a failing item must have been found")
