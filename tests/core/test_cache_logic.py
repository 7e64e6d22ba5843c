"""Cache logic with a fake model passed in through the constructor; the levels are real (L1 slabs)."""

import threading

import numpy as np
import pytest
import torch

from ragcache.core.batching import CallsInProgress, ComputeBatcher
from ragcache.core.cache import ComputeConfig, EmbeddingCache
from ragcache.core.encoder import Capabilities
from ragcache.core.levels import Levels
from ragcache.core.result import EmbedResult, Probe
from ragcache.core.scope import Prompt, Scope
from ragcache.errors import ComputeError, InvalidInputError, TierUnavailableError
from ragcache.storage.processes import poll_until
from ragcache.tiers import MemoryTier
from tests.fakes import HashEncoder

DIM = 8


class Recording:
    """Wraps a real level and records the keys it was asked for."""

    def __init__(self, tier, name):
        self.tier, self.name, self.asked, self.stored = tier, name, [], []

    def get_many(self, keys):
        self.asked.append(list(keys))
        return self.tier.get_many(keys)

    def put_many(self, keys, vectors):
        self.stored.append(list(keys))
        self.tier.put_many(keys, vectors)

    def close(self):
        self.tier.close()


class Broken:
    name = "L2"

    def __init__(self):
        self.calls = 0

    def get_many(self, keys):
        self.calls += 1
        raise TierUnavailableError("L2", "connection refused")

    put_many = get_many

    def close(self):
        pass


def levels(n_rows=(100, 100)):
    return [Recording(MemoryTier(rows * DIM * 4, DIM, torch.float32), f"L{i + 1}") for i, rows in enumerate(n_rows)]


def test_each_level_is_asked_only_for_what_is_still_missing_and_hits_are_promoted():
    encoder = HashEncoder(DIM)
    l1, l2 = levels()
    cache = EmbeddingCache(encoder, Levels([l1, l2], dim=DIM, dtype=torch.float32, write_behind=False))
    k = cache.space.keys(["a", "b", "c"])
    l2.tier.put_many([k[1]], encoder.encode(["b"]))
    l1.tier.put_many([k[0]], encoder.encode(["a"]))
    encoder.calls.clear()

    result = cache.embed_detailed(["a", "b", "c"])
    assert result.served == {"L1": 1, "L2": 1, "compute": 1}
    # L1 is asked once more, for the key about to be computed: the batcher's look for a key another caller's
    # computation may have stored in L1 since the walk (ragcache.core.batching, the hand-off window).
    assert l1.asked == [k, [k[2]]] and l2.asked == [[k[1], k[2]]]
    assert encoder.calls == [["c"]]
    assert l1.stored == [[k[1]], [k[2]]]  # the L2 hit promoted, then the computed one
    assert l2.stored == [[k[2]]]
    np.testing.assert_array_equal(result.vectors, encoder.encode(["a", "b", "c"]).numpy())
    assert cache.embed_detailed(["a", "b", "c"]).served == {"L1": 3, "L2": 0, "compute": 0}


def test_duplicates_are_computed_once_and_returned_in_input_order():
    encoder = HashEncoder(DIM)
    cache = EmbeddingCache(encoder, Levels(levels((10,)), dim=DIM, dtype=torch.float32, write_behind=False))
    texts = ["x", "y", "x", "x", "z", "y"]
    result = cache.embed_detailed(texts)
    assert sorted(encoder.calls[0]) == ["x", "y", "z"] and encoder.num_texts == 3
    np.testing.assert_array_equal(result.vectors, encoder.encode(texts).numpy())
    assert result.served["compute"] == 6 and list(result.levels) == [1] * 6


def test_empty_input_returns_an_empty_matrix_and_bad_input_is_rejected():
    cache = EmbeddingCache(HashEncoder(DIM), levels((10,)))
    assert cache.embed([]).shape == (0, DIM)
    with pytest.raises(InvalidInputError):
        cache.embed("not a list")
    with pytest.raises(InvalidInputError):
        cache.embed(["ok", None])


def test_a_failing_level_is_a_miss_counted_and_backed_off():
    encoder = HashEncoder(DIM)
    broken = Broken()
    l1 = levels((10,))[0]
    cache = EmbeddingCache(encoder, Levels([l1, broken], dim=DIM, dtype=torch.float32, write_behind=False))
    vectors = cache.embed(["a", "b"])
    np.testing.assert_array_equal(vectors, encoder.encode(["a", "b"]).numpy())
    assert cache.level_states()["L2"]["up"] is False
    calls = broken.calls
    cache.embed(["c"])  # inside the back-off: not asked at all
    assert broken.calls == calls
    stats = cache.stats()
    l2 = stats.levels[1]
    assert l2.errors == 3 and l2.misses == 3 and l2.hits == 0
    assert stats.texts == 3 and stats.texts_computed == 3


def test_stats_count_levels_and_compute_exactly():
    encoder = HashEncoder(DIM)
    cache = EmbeddingCache(encoder, Levels(levels((10,)), dim=DIM, dtype=torch.float32, write_behind=False))
    cache.embed(["a", "b"])
    cache.embed(["a", "b", "c"])
    stats = cache.stats()
    assert (stats.requests, stats.texts, stats.hits, stats.texts_computed) == (2, 5, 2, 3)
    assert stats.hit_rate == pytest.approx(2 / 5)
    (l1,) = stats.levels
    assert (l1.lookups, l1.hits, l1.misses) == (5, 2, 3)
    assert stats.compute_s_saved == pytest.approx(2 * 0.001)
    assert cache.stats(recent=True).texts == 5


def test_concurrent_misses_for_one_key_compute_it_once():
    encoder = HashEncoder(DIM, delay_s=0.05)
    cache = EmbeddingCache(encoder, Levels(levels((10,)), dim=DIM, dtype=torch.float32, write_behind=False))
    barrier = threading.Barrier(64)
    results = []

    def request():
        barrier.wait()
        results.append(cache.embed(["the same uncached text"]))

    threads = [threading.Thread(target=request) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert encoder.num_texts == 1
    assert len(results) == 64 and all(np.array_equal(r, results[0]) for r in results)


def test_misses_from_concurrent_callers_share_model_batches():
    encoder = HashEncoder(DIM, delay_s=0.03)
    cache = EmbeddingCache(encoder, Levels(levels((1000,)), dim=DIM, dtype=torch.float32, write_behind=False),
                           compute=ComputeConfig(max_batch=64))
    threads = [threading.Thread(target=cache.embed, args=([f"text {i}"],)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert encoder.num_texts == 32
    assert len(encoder.calls) < 32 and max(len(call) for call in encoder.calls) > 1


def test_the_batch_waits_for_company_only_while_a_caller_has_not_reached_it():
    # A minute's window: a wait that should not happen would show as a join that times out.
    encoder = HashEncoder(DIM)
    calls = CallsInProgress()
    batcher = ComputeBatcher(encoder.encode, max_batch=64, max_wait_s=60, calls=calls)
    with calls:  # the one call in progress (the owner's calls enter the counter, as EmbeddingCache's do)
        lone = threading.Thread(target=batcher.compute, args=(["k0"], ["alone"]))
        lone.start()
        lone.join(timeout=20)
        assert not lone.is_alive() and encoder.calls == [["alone"]]  # the only call in progress: no wait
        with calls:  # two calls in progress: the first queued waits for the second, then both go together
            first = threading.Thread(target=batcher.compute, args=(["k1"], ["first"]))
            first.start()
            assert poll_until(lambda: batcher.num_pending == 1, timeout_s=10, interval_s=0.005)
            second = threading.Thread(target=batcher.compute, args=(["k2"], ["second"]))
            second.start()
            for thread in (first, second):
                thread.join(timeout=20)
                assert not thread.is_alive()
    assert encoder.calls[1:] == [["first", "second"]]
    batcher.close()


def test_write_behind_flush_and_close_store_everything():
    encoder = HashEncoder(DIM)
    l1, l2 = levels()
    cache = EmbeddingCache(encoder, [l1, l2])
    cache.embed([f"t{i}" for i in range(50)])
    cache.flush()
    assert len(l2.tier) == 50
    cache.embed([f"u{i}" for i in range(50)])
    cache.close()  # closing flushes what is still queued before the levels are released
    assert sum(len(keys) for keys in l2.stored) == 100


def test_model_failure_reaches_the_caller_and_the_cache_keeps_working():
    class Flaky(HashEncoder):
        fail = True

        def encode(self, texts):
            if self.fail:
                raise RuntimeError("out of memory")
            return super().encode(texts)

    encoder = Flaky(DIM)
    cache = EmbeddingCache(encoder, Levels(levels((10,)), dim=DIM, dtype=torch.float32, write_behind=False))
    with pytest.raises(ComputeError, match="RuntimeError: out of memory"):  # in the ragcache tree, cause named
        cache.embed(["a"])
    encoder.fail = False
    assert cache.embed(["a"]).shape == (1, DIM)


def test_a_probe_answers_only_when_l1_holds_everything():
    encoder = HashEncoder(DIM)
    cache = EmbeddingCache(encoder, Levels(levels((10,)), dim=DIM, dtype=torch.float32, write_behind=False))
    assert isinstance(cache.probe(["a", "b"]), Probe)
    assert cache.stats().texts == 0  # a probe that stops records nothing
    expected = cache.embed(["a", "b"])
    resident = cache.probe(["b", "a", "b"])
    assert isinstance(resident, EmbedResult)
    np.testing.assert_array_equal(resident.vectors, expected[[1, 0, 1]])
    assert resident.served == {"L1": 3, "compute": 0}
    assert cache.stats().levels[0].hits == 3 and encoder.num_texts == 2


def test_a_repeat_is_served_by_a_level_never_by_a_memory_of_the_batcher():
    # L1 of one row and nothing below: the first text is evicted by the second, so its repeat must be
    # computed again and counted as computed. (The batcher once kept 4,096 recent results, a level outside
    # every budget that answered such repeats without the model while reporting them as computed.)
    encoder = HashEncoder(DIM)
    with EmbeddingCache(encoder, Levels(levels((1,)), dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        cache.embed(["first"])
        cache.embed(["second"])
        result = cache.embed_detailed(["first"])
    assert result.served == {"L1": 0, "compute": 1}
    assert encoder.calls == [["first"], ["second"], ["first"]]


class SlowFor(Recording):
    """A real level whose lookups stall for one named thread: a caller held up on L2 (a slow Redis) while
    another caller's computation of the same key ends."""

    def __init__(self, tier, name, thread_name: str, delay_s: float):
        super().__init__(tier, name)
        self.thread_name, self.delay_s = thread_name, delay_s

    def get_many(self, keys):
        hits = super().get_many(keys)  # the miss is decided now; the answer comes back late
        if threading.current_thread().name == self.thread_name:
            threading.Event().wait(self.delay_s)
        return hits


def test_a_caller_that_missed_l1_while_the_key_was_being_computed_gets_it_from_l1_not_the_model():
    encoder = HashEncoder(DIM, delay_s=0.3)
    l1 = Recording(MemoryTier(100 * DIM * 4, DIM, torch.float32), "L1")
    l2 = SlowFor(MemoryTier(100 * DIM * 4, DIM, torch.float32), "L2", thread_name="late", delay_s=0.8)
    results = {}
    with EmbeddingCache(encoder, Levels([l1, l2], dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        first = threading.Thread(target=lambda: results.__setitem__("first", cache.embed_detailed(["x"])), name="first")
        late = threading.Thread(target=lambda: results.__setitem__("late", cache.embed_detailed(["x"])), name="late")
        first.start()
        threading.Event().wait(0.1)  # "late" misses L1 while "x" is computed, then waits on L2 past its end
        late.start()
        first.join(30)
        late.join(30)
        stats = cache.stats()
    assert encoder.calls == [["x"]]
    assert results["first"].served == {"L1": 0, "L2": 0, "compute": 1}
    assert results["late"].served == {"L1": 1, "L2": 0, "compute": 0}
    assert np.array_equal(results["late"].vectors, results["first"].vectors)
    assert stats.texts_computed == 1 and stats.hits == 1


def test_a_request_whose_every_text_arrived_in_l1_meanwhile_writes_nothing_below():
    # The same window with L2 a real level that refuses empty writes would be a 500; nothing is written.
    encoder = HashEncoder(DIM, delay_s=0.3)
    l1 = Recording(MemoryTier(100 * DIM * 4, DIM, torch.float32), "L1")
    l2 = SlowFor(MemoryTier(100 * DIM * 4, DIM, torch.float32), "L2", thread_name="late", delay_s=0.8)
    with EmbeddingCache(encoder, Levels([l1, l2], dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        first = threading.Thread(target=cache.embed, args=(["x", "y"],), name="first")
        first.start()
        threading.Event().wait(0.1)
        late = threading.Thread(target=cache.embed, args=(["x", "y"],), name="late")
        late.start()
        first.join(30)
        late.join(30)
    assert l2.stored == [list(cache.space.keys(["x", "y"]))]  # the first caller's write only


class PromptRecording(HashEncoder):
    """Takes sentence-transformers' ``prompt=`` and records each call's prompt; holds its first call until ``gate``."""

    capabilities = Capabilities(takes_prompt=True)

    def __init__(self):
        super().__init__(DIM)
        self.prompts: list[str | None] = []
        self.gate = threading.Event()

    def encode(self, texts, *, prompt=None):
        if not self.prompts:
            self.gate.wait(20)
        self.prompts.append(prompt)
        return super().encode([(prompt or "") + text for text in texts])


def test_a_batch_holds_one_prompts_texts_in_queue_order():
    encoder = PromptRecording()
    batcher = ComputeBatcher(encoder.encode, max_batch=64, max_wait_s=0)
    held = threading.Thread(target=batcher.compute, args=(["k0"], ["held"]))
    held.start()
    assert poll_until(lambda: encoder.calls == [] and batcher.num_pending == 0, timeout_s=10, interval_s=0.005)
    asks = [(["k1"], ["one"], "q: "), (["k2"], ["two"], None), (["k3"], ["three"], "q: "), (["k4"], ["four"], "p: ")]
    callers = [threading.Thread(target=batcher.compute, args=(keys, texts), kwargs={"prompt": prompt}) for keys, texts, prompt in asks]
    for number, caller in enumerate(callers, start=1):
        caller.start()
        assert poll_until(lambda number=number: batcher.num_pending == number, timeout_s=10, interval_s=0.005)
    encoder.gate.set()
    for thread in (held, *callers):
        thread.join(timeout=20)
        assert not thread.is_alive()
    batcher.close()
    assert encoder.prompts == [None, "q: ", None, "p: "]
    assert encoder.calls == [["held"], ["q: one", "q: three"], ["two"], ["p: four"]]


def test_one_cache_serves_every_scope_with_keys_of_its_own_and_no_thread_of_its_own():
    encoder = HashEncoder(DIM)  # no prompt argument: the prompt is put before each text
    query, document = Prompt("query", "query: "), Prompt("document", "passage: ")
    with EmbeddingCache(encoder, Levels(levels((1000,)), dim=DIM, dtype=torch.float32, write_behind=False)) as cache:
        threads = threading.active_count()
        acme_query = cache.scoped(Scope("acme", query))
        assert acme_query.space.namespace == "acme" and acme_query.space.prompt == "query: "
        assert acme_query.embed_detailed(["x"]).served["compute"] == 1
        assert cache.embed_detailed(["x"], scope=Scope("acme", query)).served["L1"] == 1  # the same scope, the same key
        assert cache.embed_detailed(["x"], scope=Scope(prompt=query)).served["compute"] == 1  # another tenant
        assert cache.embed_detailed(["x"], scope=Scope(prompt=document)).served["compute"] == 1  # another prompt
        assert cache.embed_detailed(["x"]).served["compute"] == 1  # the model's own space
        acme_query.close()  # a view: closes nothing
        assert cache.embed_detailed(["x"]).served["L1"] == 1 and threading.active_count() == threads
        prompts, tenants = cache.prompt_stats(), cache.namespace_stats()
    assert encoder.calls == [["query: x"], ["query: x"], ["passage: x"], ["x"]]
    assert {name: (figures.texts, figures.hits) for name, figures in prompts.items()} == {"query": (3, 1), "document": (1, 0)}
    assert {name: (figures.texts, figures.hits) for name, figures in tenants.items()} == {"acme": (2, 1)}
    assert cache.stats().texts == 6



def test_requests_walked_together_are_answered_and_counted_each_as_its_own():
    encoder = HashEncoder(DIM)
    l1, l2 = levels()
    cache = EmbeddingCache(encoder, Levels([l1, l2], dim=DIM, dtype=torch.float32, write_behind=False))
    cache.embed(["a"])  # in L1 now
    encoder.calls.clear()
    l1.asked.clear(), l2.asked.clear()

    first, second, third, fourth = cache.embed_requests([["a", "b"], ["c"], ["b", "d"], ["e", "e"]])
    # One walk: each level asked once for the keys still missing, one model call for the distinct new texts.
    assert len(l2.asked) == 1 and sorted(encoder.calls[0]) == ["b", "c", "d", "e"] and len(encoder.calls) == 1
    assert first.served == {"L1": 1, "L2": 0, "compute": 1}
    assert second.served == {"L1": 0, "L2": 0, "compute": 1}
    assert third.served == {"L1": 0, "L2": 0, "compute": 2}  # "b" counts in both requests, as when concurrent
    assert fourth.served == {"L1": 0, "L2": 0, "compute": 2}  # each input's level, as embed_detailed gives it
    for result, texts in ((first, ["a", "b"]), (second, ["c"]), (third, ["b", "d"]), (fourth, ["e", "e"])):
        np.testing.assert_array_equal(result.vectors, encoder.encode(texts).numpy())
    stats = cache.stats()
    # embed(["a"]) included. "b" is computed in both requests that carry it, as two concurrent requests count it;
    # "e", twice in one request, is computed once there and its repeat is a hit, as embed_detailed counts it.
    assert (stats.requests, stats.texts, stats.hits, stats.texts_computed) == (5, 8, 2, 6)
    alone = EmbeddingCache(HashEncoder(DIM), Levels(levels(), dim=DIM, dtype=torch.float32, write_behind=False))
    alone.embed_detailed(["e", "e"])
    assert (alone.stats().hits, alone.stats().texts_computed) == (1, 1)
