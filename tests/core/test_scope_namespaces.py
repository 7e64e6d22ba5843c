"""Key namespaces (a tenant's) inside one EmbeddingCache: own keys and counters, shared levels, model and
threads. Each tenant used to get a whole EmbeddingCache of its own (its batcher and write-behind threads, its
breakers, none of it in /stats or /health), and closing one cleared the L1 slab every tenant shared."""

from __future__ import annotations

import threading

import numpy as np
import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.result import EmbedResult, Probe
from ragcache.core.scope import Scope
from ragcache.tiers import MemoryTier
from tests.fakes import HashEncoder

DIM = 8


def tenant_of(cache: EmbeddingCache, name: str) -> EmbeddingCache:
    return cache.scoped(Scope(tenant=name))


def make_cache():
    encoder = HashEncoder(DIM)
    tiers = [MemoryTier(1 << 16, DIM, torch.float32), MemoryTier(1 << 16, DIM, torch.float32)]
    tiers[1].name = "L2"
    return encoder, EmbeddingCache(encoder, tiers)


def test_a_namespace_has_its_own_keys_and_hits():
    encoder, cache = make_cache()
    acme, globex = tenant_of(cache, "acme"), tenant_of(cache, "globex")
    assert acme.space.namespace == "acme" and acme.space.space_id != cache.space.space_id
    assert acme.space.keys(["x"]) != globex.space.keys(["x"])
    first = acme.embed_detailed(["a text acme embedded"])
    assert first.served["compute"] == 1
    assert acme.embed_detailed(["a text acme embedded"]).served["L1"] == 1
    # globex (and the shared namespace) cannot tell: a miss, computed again; the same vector.
    other = globex.embed_detailed(["a text acme embedded"])
    assert other.served["compute"] == 1
    assert cache.embed_detailed(["a text acme embedded"]).served["compute"] == 1
    np.testing.assert_array_equal(other.vectors, first.vectors)
    assert isinstance(acme.probe(["a text acme embedded"]), EmbedResult)
    assert isinstance(globex.probe(["never embedded"]), Probe)
    cache.close()


def test_namespaces_are_counted_apart_and_in_the_cache_figures():
    _, cache = make_cache()
    tenant_of(cache, "acme").embed(["one", "two"])
    tenant_of(cache, "acme").embed(["one"])
    tenant_of(cache, "globex").embed(["one"])
    figures = cache.namespace_stats()
    assert sorted(figures) == ["acme", "globex"]
    assert (figures["acme"].requests, figures["acme"].texts, figures["acme"].hits) == (2, 3, 1)
    assert (figures["globex"].texts, figures["globex"].hits) == (1, 0)
    assert cache.stats().texts == 4
    cache.close()


def test_a_namespace_adds_no_thread_and_leaves_the_shared_levels_alone():
    _, cache = make_cache()
    cache.embed(["shared text"])
    threads = threading.active_count()
    for name in ("acme", "globex", "initech"):
        view = tenant_of(cache, name)
        view.embed([f"{name} text"])
        view.close()  # nothing of its own to close: the cache's L1 keeps everything
    assert threading.active_count() == threads
    assert cache.embed_detailed(["shared text"]).served["L1"] == 1
    assert tenant_of(cache, "acme").embed_detailed(["acme text"]).served["L1"] == 1
    cache.close()
