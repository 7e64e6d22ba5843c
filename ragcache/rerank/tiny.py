"""A tiny cross-encoder built offline, for the mechanics of reranking (tests, benches, demos).

No package on the registries this machine reaches ships trained cross-encoder weights (the package lists
were searched for ms-marco, cross-encoder and packaged-model names), and model hubs are unreachable. So the
mechanics (loading a ``CrossEncoder`` folder, scoring, caching, serving it through Infinity or ragcache's
own ``/rerank``) are exercised with a small BERT classifier built here: random weights from a fixed seed,
the packaged all-MiniLM-L6-v2 tokenizer. Its scores are deterministic and meaningless as relevance; no
quality figure is ever reported for it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["build_tiny_cross_encoder"]


def build_tiny_cross_encoder(folder: str | Path, *, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Write a ``CrossEncoder``-loadable folder (config, weights, tokenizer) to ``folder``; returns it.

    Same seed, same weights: the folder's content hash (the reranker's revision) is stable across runs."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from ragcache.models.local import PACKAGED_MODEL, resolve_model_path

    folder = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(PACKAGED_MODEL), local_files_only=True)
    config = BertConfig(  # type: ignore[call-arg]
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        intermediate_size=hidden_size * 2,
        max_position_embeddings=512,
        initializer_range=0.2,  # wider than BERT's 0.02, so random scores differ visibly between pairs
        num_labels=1,  # one relevance logit per (query, text) pair, as ms-marco cross-encoders have
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
