"""The same contract, run against every encoder: the local torch model, ONNX Runtime (float32 and int8), and
each remote provider (OpenAI-compatible, TEI, Ollama) with the real Infinity server behind it.

The contract is what the library calls on an encoder, and nothing more: ``space``, ``encode(texts)`` and
``stats()`` (``EmbeddingCache`` and its batcher; ``compute_s`` and ``seconds_per_text``), ``device`` (the
builder puts L1 there), and ``count_tokens`` / ``check_lengths`` (``EmbeddingCache.tokenizer``, the service's
length check and ``usage``). Every encoder here serves the packaged all-MiniLM-L6-v2, so each one's vectors
are also held to the torch model's: the model its space names is the model that computed them.

Infinity speaks only the OpenAI route; TEI's and Ollama's native routes are answered by the translators of
tests/models/remote/test_providers_wire.py, which ask Infinity for the same batch (the vectors are Infinity's,
only the wire format is ours). The TEI and Ollama encoders have no local tokenizer: they count by estimate.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.encoder import capabilities_of
from ragcache.core.tokens import TokenCounter, Tokenizer
from ragcache.errors import InvalidInputError, InvalidTextError
from ragcache.models.local import PACKAGED_MODEL, TORCH_DTYPES, EncoderStats, ModelEncoder
from ragcache.models.remote import RemoteEncoder, RemoteModel, UpstreamStats, open_remote_encoder
from ragcache.models.remote.tokens import estimate_tokens
from ragcache.tiers.memory import MemoryTier
from tests.models.remote.loopback import LoopbackServer
from tests.models.remote.test_providers_infinity import infinity_model
from tests.models.remote.test_providers_wire import ollama_translator, tei_translator

# Short, empty, non-ASCII, a repeat, one over the local model's 256 tokens (it truncates), one character.
TEXTS = ["What is a KV cache?", "", "naïve café 🤖 東京", "Redis is an in-memory store.", "What is a KV cache?",
         "word " * 300, "x"]
LONE_SURROGATE = "bad \ud800 text"
# Largest cosine distance between two vectors of one text (in another batch, or from the torch model).
# float32 engines differ in their last bits only (measured here: at most 2.4e-7); int8's dynamic quantisation
# scales activations over the whole batch, so its vectors move with the batch (0.028 measured, 0.022 from torch).
FLOAT32_BOUND = 1e-5
INT8_BOUND = 0.05
UNIT_NORM_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Subject:
    """An encoder under the contract and what it promises: the model and kind its space names, how close two
    vectors of one text are, and how it counts tokens ("tokenizer": the model's own; "estimate")."""

    encoder: ModelEncoder | RemoteEncoder  # OnnxEncoder is a ModelEncoder
    model: str
    kind: dict[str, str | None]  # the space's provider and backend
    bound: float
    token_counting: str


ENCODERS = ["torch", "onnx", "onnx-int8", "openai", "tei", "ollama"]


@pytest.fixture(scope="module", params=ENCODERS)
def subject(request) -> Iterator[Subject]:
    name = request.param
    if name == "torch":
        yield Subject(request.getfixturevalue("encoder"), PACKAGED_MODEL, {"provider": None, "backend": None},
                      FLOAT32_BOUND, "tokenizer")
    elif name in ("onnx", "onnx-int8"):
        encoder = request.getfixturevalue({"onnx": "onnx_encoder", "onnx-int8": "int8_encoder"}[name])
        yield Subject(encoder, PACKAGED_MODEL, {"provider": None, "backend": name},
                      INT8_BOUND if name == "onnx-int8" else FLOAT32_BOUND, "tokenizer")
    else:
        yield from remote_subject(name, request.getfixturevalue("infinity"))


def remote_subject(provider: str, infinity) -> Iterator[Subject]:
    if provider == "openai":
        # Infinity itself, counting tokens with the model's own tokenizer (a local folder).
        encoder = open_remote_encoder(infinity_model(infinity, name="contract-openai"), {})
        try:
            yield Subject(encoder, infinity.model_id, {"provider": "openai", "backend": None}, FLOAT32_BOUND, "tokenizer")
        finally:
            encoder.close()
        return
    translator = {"tei": tei_translator, "ollama": ollama_translator}[provider]
    with LoopbackServer(translator(infinity)) as server:
        model = RemoteModel(name=f"contract-{provider}", provider=provider, base_url=server.url, upstream_model="all-minilm",
                            dimensions=384, normalize=True, max_inputs=8)
        encoder = open_remote_encoder(model, {})
        try:
            yield Subject(encoder, "all-minilm", {"provider": provider, "backend": None}, FLOAT32_BOUND, "estimate")
        finally:
            encoder.close()


def cosine_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 1 - torch.nn.functional.cosine_similarity(a.float().cpu(), b.float().cpu())


def test_it_offers_what_the_cache_and_the_service_call(subject):
    encoder = subject.encoder
    assert callable(encoder.encode) and callable(encoder.stats)
    assert isinstance(encoder.stats(), EncoderStats)
    assert isinstance(encoder.device, torch.device)
    assert isinstance(encoder, TokenCounter)  # EmbeddingCache.tokenizer's check


def test_its_capabilities_declare_what_it_can_do_beyond_encoding(subject):
    # What the service and Ray read instead of asking which class an encoder is (issue 41.5).
    capabilities = capabilities_of(subject.encoder)
    remote = isinstance(subject.encoder, RemoteEncoder)
    assert capabilities.counts_tokens
    assert capabilities.remote == remote
    assert capabilities.tokenizes == (not remote) == isinstance(subject.encoder, Tokenizer)
    assert capabilities.takes_prompt == (not remote)
    assert not capabilities.passes_caller_key  # no model here passes its callers' keys through


def test_the_space_describes_the_vectors_it_returns(subject):
    encoder, space = subject.encoder, subject.encoder.space
    vectors = encoder.encode(TEXTS)
    assert vectors.shape == (len(TEXTS), space.dim)
    assert vectors.dtype == TORCH_DTYPES[space.dtype]
    assert vectors.device.type == encoder.device.type
    assert space.model == subject.model
    assert {"provider": space.provider, "backend": space.backend} == subject.kind


def test_the_model_the_space_names_computed_the_vectors(subject, encoder):
    # Every subject serves all-MiniLM-L6-v2: its vectors are the torch model's, up to the engine's noise.
    texts = [text for text in TEXTS if len(text) < 100]  # engines may truncate a long text at other lengths
    distances = cosine_distances(subject.encoder.encode(texts), encoder.encode(texts))
    assert distances.max().item() <= subject.bound, distances.tolist()


def test_a_batch_gives_one_row_per_text_in_order(subject):
    forward = subject.encoder.encode(TEXTS)
    backward = subject.encoder.encode(TEXTS[::-1]).flip(0)
    assert len(forward) == len(backward) == len(TEXTS)
    similarity = torch.nn.functional.cosine_similarity(forward.float().cpu()[:, None], backward.float().cpu()[None], dim=2)
    nearest = similarity.argmax(dim=1).tolist()
    # Each row is nearest its own text's row of the reversed batch (a repeat: either of its two rows).
    assert [TEXTS[j] for j in nearest] == TEXTS
    assert torch.equal(forward[0], forward[4])  # a repeat in one batch: the same vector


def test_a_text_gives_the_same_vector_in_a_batch_and_alone(subject):
    batch = subject.encoder.encode(TEXTS)
    alone = torch.cat([subject.encoder.encode([text]) for text in TEXTS])
    distances = cosine_distances(batch, alone)
    assert distances.max().item() <= subject.bound, distances.tolist()


def test_vectors_are_finite_and_unit_length_when_the_space_says_so(subject):
    vectors = subject.encoder.encode(TEXTS).float()
    assert torch.isfinite(vectors).all()
    assert (vectors.norm(dim=1) > 0).all()
    if subject.encoder.space.normalize:
        torch.testing.assert_close(vectors.norm(dim=1).cpu(), torch.ones(len(TEXTS)), rtol=0, atol=UNIT_NORM_TOLERANCE)


def test_an_empty_batch_is_an_empty_matrix_and_computes_nothing(subject):
    encoder, space = subject.encoder, subject.encoder.space
    before = encoder.stats()
    vectors = encoder.encode([])
    assert vectors.shape == (0, space.dim) and vectors.dtype == TORCH_DTYPES[space.dtype]
    assert encoder.count_tokens([]) == []
    encoder.check_lengths([])
    after = encoder.stats()
    assert (after.num_texts, after.num_batches) == (before.num_texts, before.num_batches)


@pytest.mark.parametrize("call", ["encode", "count_tokens", "check_lengths"])
def test_a_text_that_is_not_valid_unicode_is_refused_naming_it(subject, call):
    before = subject.encoder.stats()
    with pytest.raises(InvalidTextError, match="surrogate") as refused:
        getattr(subject.encoder, call)(["fine", LONE_SURROGATE])
    assert refused.value.index == 1
    after = subject.encoder.stats()
    assert (after.num_texts, after.num_batches) == (before.num_texts, before.num_batches)  # nothing computed or sent


def test_an_over_long_text_fails_the_length_check_naming_it_and_encode_truncates_it(subject):
    encoder, limit = subject.encoder, subject.encoder.space.max_seq_length
    over_long = "word " * (limit + 8)
    encoder.check_lengths(["fine", "word " * (limit // 4)])  # within the limit, by tokenizer or estimate
    with pytest.raises(InvalidInputError, match=str(limit)) as refused:
        encoder.check_lengths(["fine", over_long], field="texts")
    assert refused.value.field == "texts[1]" and not isinstance(refused.value, InvalidTextError)
    vectors = encoder.encode([over_long])  # what the service sends with truncate=true: the model cuts it
    assert vectors.shape == (1, encoder.space.dim) and torch.isfinite(vectors.float()).all()


def test_token_counts_are_per_text_in_order(subject, encoder):
    counts = subject.encoder.count_tokens(TEXTS)
    assert counts == [subject.encoder.count_tokens([text])[0] for text in TEXTS]
    if subject.token_counting == "tokenizer":
        # The packaged model's own tokenizer, special tokens included, before truncation.
        expected = [len(ids) for ids in encoder.tokenizer(TEXTS, truncation=False)["input_ids"]]
    else:
        expected = [estimate_tokens(text) for text in TEXTS]
    assert counts == expected
    stats = subject.encoder.stats()
    if isinstance(stats, UpstreamStats):
        assert stats.token_counting == subject.token_counting


def test_stats_count_what_was_computed_and_health_shows_up(subject):
    encoder = subject.encoder
    texts = [f"counted text {i} of a stats check" for i in range(3)]
    before = encoder.stats()
    encoder.encode(texts)
    after = encoder.stats()
    assert after.num_texts - before.num_texts == len(texts)
    num_batches = after.num_batches - before.num_batches
    assert num_batches >= 1 and sum(after.batch_sizes[-num_batches:]) == len(texts)
    assert after.compute_s > before.compute_s and after.seconds_per_text > 0
    if isinstance(after, UpstreamStats):  # a remote model's health and upstream figures
        assert after.up and after.num_errors == before.num_errors
        assert (after.provider, after.endpoint) == (encoder.space.provider, encoder.space.endpoint)
        assert after.num_calls - before.num_calls == num_batches and after.num_tokens > before.num_tokens


def test_the_cache_computes_through_it_and_reads_its_stats(subject):
    encoder, space = subject.encoder, subject.encoder.space
    texts = [f"through the cache: {text}" for text in TEXTS]
    l1 = MemoryTier(1 << 20, space.dim, TORCH_DTYPES[space.dtype], device=encoder.device)
    with EmbeddingCache(encoder, [l1], device=encoder.device) as cache:
        computed = cache.embed_detailed(texts, as_tensor=True)
        assert computed.served["compute"] == len(texts)
        distances = cosine_distances(torch.as_tensor(computed.vectors), encoder.encode(texts))
        assert distances.max().item() <= subject.bound, distances.tolist()
        again = cache.embed_detailed(texts, as_tensor=True)
        assert again.served["L1"] == len(texts) and torch.equal(torch.as_tensor(again.vectors), torch.as_tensor(computed.vectors))
        assert cache.stats().compute_s == encoder.stats().compute_s
