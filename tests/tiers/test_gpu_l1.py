"""The GPU-path check of L1 (ragcache_bench.gpu_l1), run here on the CPU: the same code a GPU run executes.

On a machine with CUDA, ``python -m ragcache_bench.gpu_l1`` runs it against the device; CI has none.
"""

from __future__ import annotations

import json

import pytest
import torch

from ragcache_bench import gpu_l1


def test_checks_pass_and_every_size_is_timed_on_cpu():
    handoffs, timings = gpu_l1.check_and_time(torch.device("cpu"), sizes=(1, 10, 1000), num_entries=2000, dim=16, repeats=2)
    assert [(t.dtype, t.num_keys) for t in timings] == [(d, n) for d in gpu_l1.DTYPES for n in (1, 10, 1000)]
    assert all(t.device_lookup_us > 0 and t.cpu_lookup_then_copy_us > 0 for t in timings)
    assert [h["dtype"] for h in handoffs] == list(gpu_l1.DTYPES)
    assert all(h["device"] == "cpu" and h["device_to_host_copies"] is None for h in handoffs)


def test_handoff_returns_tensor_on_the_cache_device_without_computing():
    handoff = gpu_l1.check_handoff("bfloat16", torch.device("cpu"), num_keys=50, dim=8)
    assert handoff == {"dtype": "bfloat16", "num_keys": 50, "device": "cpu", "device_to_host_copies": None}


def test_exactness_check_catches_a_differing_slab():
    keys, _, cpu_tier, other_tier = gpu_l1._filled_pair(torch.float32, 8, 100, torch.device("cpu"), seed=0)
    other_tier.put_many(keys[:1], torch.zeros(1, 8))
    with pytest.raises(AssertionError, match="not bit-identical"):
        gpu_l1._check_exact(keys[:1], cpu_tier, other_tier, num_keys=1, seed=0)


def test_main_writes_json_and_refuses_a_missing_device(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu_l1.main(["--device", "cpu", "--entries", "10000", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and len(report["timings"]) == len(gpu_l1.DTYPES) * len(gpu_l1.SIZES)
    if not torch.cuda.is_available():
        assert gpu_l1.main(["--device", "cuda", "--out", str(out)]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
