"""Build a tiny, randomly initialised Llama model and a BPE tokenizer for the vLLM tests.

The weights are random (seeded), so the model's output is noise; what the tests need from it is real
vLLM behaviour around it: tokenisation, prefill, KV blocks, prefix caching and eviction. The tokenizer
is a byte-level BPE trained on the Python standard library's own source files, so nothing is downloaded.

Run with the python of the vLLM virtual environment (it has torch, transformers and tokenizers):

    .venv-vllm/bin/python scripts/build_tiny_llama.py --out .cache/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
# A minimal chat template (system first, then the turns) so the chat API works and a system prompt
# is rendered at the very start of the prompt, where it can be a shared prefix.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def stdlib_texts(max_files: int) -> Iterator[str]:
    """Yield the text of up to ``max_files`` stdlib source files, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())[:max_files]
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


def build_tokenizer(out: Path, vocab_size: int, max_files: int, model_max_length: int) -> int:
    """Train a byte-level BPE tokenizer on stdlib sources and save it in transformers' format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(stdlib_texts(max_files), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Prepend BOS like Llama tokenizers do, so vLLM's prompts look like a real model's.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return tok.get_vocab_size()


def build_model(out: Path, vocab_size: int, max_len: int, seed: int) -> int:
    """Save a 2-layer Llama (hidden 128, 2 heads of 64) with seeded random weights; return #params."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_len,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".cache/tiny-llama"))
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--max-files", type=int, default=400, help="stdlib files to train the tokenizer on")
    parser.add_argument("--max-len", type=int, default=4096, help="max positions of the model")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(args.out, args.vocab_size, args.max_files, args.max_len)
    num_params = build_model(args.out, vocab, args.max_len, args.seed)
    summary = {"out": str(args.out), "vocab_size": vocab, "num_params": num_params,
               "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
