"""Compute on ONNX Runtime: the same sentence-transformers model, its transformer exported to ONNX here.

The transformer (the model folder's first module) is exported locally with ``torch.onnx.export`` (the
TorchScript exporter: it needs no ``onnxscript`` and gives dynamic batch and sequence axes), once per
model weights, into ``<cache_dir>/<weights hash>-opset<N>-torch<version>/model.onnx``; ``onnx-int8`` adds
``model.int8.onnx``, the same graph with its weights dynamically quantised to int8
(``onnxruntime.quantization.quantize_dynamic``). Nothing is downloaded.

Everything around the transformer stays sentence-transformers' own, so the pipeline of the model folder
is reproduced exactly: its tokenizer, truncation at ``max_seq_length`` and prompt handling
(``SentenceTransformer.preprocess``), then the modules after the transformer as ``modules.json`` lists
them (Pooling: mean, cls, max...; Dense; Normalize), run in torch on the token embeddings ONNX Runtime
returns. ONNX's bits differ from torch's, and int8's from both: each backend is its own embedding space
(``EmbeddingSpace.backend``), never mixed with the torch vectors of the same model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
import warnings
from pathlib import Path
from typing import Unpack

import numpy as np
import torch

from ragcache.errors import ConfigError
from ragcache.models.local import PACKAGED_MODEL, LocalModelOptions, ModelEncoder, fingerprint_weights
from ragcache.observe.logs import DropMessages

__all__ = ["BACKENDS", "OnnxEncoder", "export_transformer"]

BACKENDS = ("torch", "onnx", "onnx-int8")
OPSET = 17
# The transformer inputs a BERT-like model takes; those the tokenizer does not produce are left out.
_INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


class _Transformer(torch.nn.Module):
    """The Hugging Face model behind positional inputs, returning the token embeddings (for the exporter)."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.input_names, inputs)), return_dict=True).last_hidden_state


def export_transformer(st_model, folder: Path, *, quantize: bool) -> Path:
    """The ONNX file of ``st_model``'s transformer in ``folder`` (int8 if ``quantize``), exported if absent.

    Written to a temporary name and renamed: a crash or a second process never leaves half a file."""
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "model.onnx"
    if not fp32.exists():
        module = st_model[0]
        if getattr(module, "module_output_name", "token_embeddings") != "token_embeddings":
            raise ConfigError("the ONNX backend takes models whose first module returns token embeddings")
        # Two texts of different lengths: the traced graph sees padding and a batch above one. Inputs and the
        # output are named as optimum names them, so other ONNX runners (fastembed, Infinity's optimum) load it.
        sample = st_model.preprocess(["an example text to trace the model with", "short"])
        names = tuple(name for name in _INPUT_NAMES if name in sample)
        axes = {name: {0: "batch", 1: "sequence"} for name in (*names, "last_hidden_state")}
        with warnings.catch_warnings():
            # The tracer's notes on transformers' Python-level checks (a padding length and an is_causal flag, both
            # the same for every input of an encoder: the traced graph is compared with torch's vectors in
            # tests/models) and the exporter's note that advanced indexing takes several ONNX operators: nothing a
            # user can act on, printed at the first start with the ONNX backend.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message="Exporting aten::index operator of advanced indexing")
            _atomic(fp32, lambda tmp: torch.onnx.export(
                _Transformer(module.model, names).eval(), tuple(sample[name] for name in names), str(tmp),
                dynamo=False, input_names=list(names), output_names=["last_hidden_state"], dynamic_axes=axes,
                opset_version=OPSET,
            ))
    if not quantize:
        return fp32
    int8 = folder / "model.int8.onnx"
    if not int8.exists():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # Per-channel weight scales, MatMuls only (measured on all-MiniLM-L6-v2 against torch: largest cosine
        # distance 0.023 over varied texts, where per-tensor scales on every op gave 0.116).
        # onnxruntime logs (on the root logger) a suggestion to pre-process the model first: the int8 model's distance
        # to torch's vectors is measured as it is (above), so the suggestion is only noise at the first start.
        suggestion = DropMessages("Please consider to run pre-processing before quantization")
        logging.getLogger().addFilter(suggestion)
        try:
            _atomic(int8, lambda tmp: quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8,
                                                       per_channel=True, op_types_to_quantize=["MatMul"]))
        finally:
            logging.getLogger().removeFilter(suggestion)
    return int8


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with torch.inference_mode(False), torch.no_grad():
            write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class OnnxEncoder(ModelEncoder):
    """A ``ModelEncoder`` whose transformer runs on ONNX Runtime (CPU): same interface, its own space.

    ``backend``: "onnx" (float32) or "onnx-int8" (int8 weights, dynamic quantisation). ``cache_dir``: where
    the exported files are kept (``<data_dir>/onnx`` from settings). The rest is what every local backend takes
    (``LocalModelOptions``, as ``ModelEncoder``). Vectors come back float32 on the CPU."""

    def __init__(
        self,
        model: str = PACKAGED_MODEL,
        *,
        backend: str = "onnx",
        cache_dir: Path,
        num_threads: int | None = None,
        **shared: Unpack[LocalModelOptions],
    ):
        if backend not in BACKENDS[1:]:
            raise ConfigError(f"an ONNX backend is one of {BACKENDS[1:]}, got {backend!r}")
        dtype = shared.get("dtype", "float32")
        if dtype != "float32":
            raise ConfigError(f"the ONNX backend computes float32 vectors; dtype {dtype!r} needs the torch backend")
        import onnxruntime

        super().__init__(model, device="cpu", **shared)
        self.backend = backend
        self.space = dataclasses.replace(self.space, backend=backend)
        folder = Path(cache_dir) / f"{fingerprint_weights(self.model)}-opset{OPSET}-torch{torch.__version__}"
        self.onnx_path = export_transformer(self.model, folder, quantize=backend == "onnx-int8")
        options = onnxruntime.SessionOptions()
        # As many threads as torch would use, so that a comparison of the two backends is like for like.
        options.intra_op_num_threads = num_threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])
        self._input_names = [node.name for node in self.session.get_inputs()]
        self._after_transformer = list(self.model)[1:]  # Pooling, Dense, Normalize... as modules.json lists them

    def _forward(self, texts: list[str], prompt: str | None) -> torch.Tensor:
        # Longest first, as sentence-transformers batches: texts of like length share a batch, less padding.
        order = sorted(range(len(texts)), key=lambda row: -len(texts[row]))
        vectors = torch.empty(len(texts), self.dim)
        for start in range(0, len(texts), self.batch_size):
            rows = order[start : start + self.batch_size]
            features = self.model.preprocess([texts[row] for row in rows], prompt=prompt)
            feeds = {name: features[name].numpy().astype(np.int64, copy=False) for name in self._input_names}
            (hidden,) = self.session.run(None, feeds)
            features["token_embeddings"] = torch.from_numpy(hidden)
            with torch.inference_mode():
                for module in self._after_transformer:
                    features = module(features)
                batch = features["sentence_embedding"]
                if self.normalize:
                    batch = torch.nn.functional.normalize(batch, p=2, dim=1)
            vectors[rows] = batch
        return vectors
