"""What turns text into vectors: the local model (``local``: torch, ``onnx``), the remote providers (``remote``),
prompts, drift checks and fingerprints.

Each name is imported on first use, so reading a prompt name or a constant does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache.observe.exports import lazy_exports

_EXPORTS = {
    ".local": (
        "ModelEncoder",
        "EncoderStats",
        "PACKAGED_MODEL",
        "TORCH_DTYPES",
        "fingerprint_folder",
        "fingerprint_weights",
        "resolve_model_path",
    ),
    ".onnx": ("OnnxEncoder",),
    ".remote": ("RemoteEncoder", "ApiKey", "load_models", "open_remote_encoder"),
    ".remote.metrics": ("UpstreamCollector",),
    ".remote.stats": ("upstream_figures",),
    ".prompts": ("DOCUMENT", "QUERY", "known_prompts", "prompt_name_of"),
    ".drift": ("DriftGuard", "DriftMonitor", "DriftState"),
    ".fingerprints": ("Fingerprints",),
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ragcache.models.drift import DriftGuard, DriftMonitor, DriftState
    from ragcache.models.fingerprints import Fingerprints
    from ragcache.models.local import (
        PACKAGED_MODEL,
        TORCH_DTYPES,
        EncoderStats,
        ModelEncoder,
        fingerprint_folder,
        fingerprint_weights,
        resolve_model_path,
    )
    from ragcache.models.onnx import OnnxEncoder
    from ragcache.models.prompts import DOCUMENT, QUERY, known_prompts, prompt_name_of
    from ragcache.models.remote import ApiKey, RemoteEncoder, load_models, open_remote_encoder
    from ragcache.models.remote.metrics import UpstreamCollector
    from ragcache.models.remote.stats import upstream_figures
