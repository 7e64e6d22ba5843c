"""``ragcache bench compute``'s verdict logic: a peer that did not run, or an int8 space too far from torch,
fails the target instead of flattering it; the cosine distance it reports."""

from __future__ import annotations

import numpy as np

from ragcache_bench.compute import FASTEMBED, INFINITY_ONNX, INFINITY_TORCH, _largest_cosine_distance, _verdict
from ragcache_bench.report import BenchResult

OURS = {"ragcache torch": 100.0, "ragcache onnx": 150.0, "ragcache onnx-int8": 240.0}
CLOSE = {"ragcache torch": 0.0, "ragcache onnx": 1e-7, "ragcache onnx-int8": 0.02}


def verdict_of(rates, distances):
    result = BenchResult("compute", "test")
    _verdict(result, rates, distances, {})
    return {figure.name: figure for figure in result.figures}


def test_the_best_backend_against_the_fastest_peer():
    figures = verdict_of({**OURS, FASTEMBED: 160.0, INFINITY_TORCH: 120.0, INFINITY_ONNX: 150.0}, CLOSE)
    ratio = figures["computed: ragcache best / fastest peer"]
    assert ratio.value == 240.0 / 160.0 and ratio.verdict == "PASS"
    assert "ragcache onnx-int8" in ratio.note and FASTEMBED in ratio.note
    assert figures["computed: ragcache best float32 / fastest peer"].value == 150.0 / 160.0


def test_slower_than_a_peer_is_a_miss():
    figures = verdict_of({**OURS, FASTEMBED: 300.0, INFINITY_TORCH: 120.0, INFINITY_ONNX: 150.0}, CLOSE)
    assert figures["computed: ragcache best / fastest peer"].verdict == "MISS"


def test_a_peer_that_did_not_run_fails_the_target():
    figures = verdict_of({**OURS, INFINITY_TORCH: 120.0, INFINITY_ONNX: 150.0}, CLOSE)
    ratio = figures["computed: ragcache best / fastest peer"]
    assert ratio.verdict == "MISS" and ratio.failed_requirements == ["fastembed ran"]


def test_int8_too_far_from_torch_fails_the_target():
    figures = verdict_of({**OURS, FASTEMBED: 100.0, INFINITY_TORCH: 100.0, INFINITY_ONNX: 100.0},
                         {**CLOSE, "ragcache onnx-int8": 0.2})
    assert figures["computed: ragcache best / fastest peer"].failed_requirements == ["int8 within 0.05 cosine of torch"]


def test_largest_cosine_distance_ignores_length_and_finds_the_worst_row():
    reference = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    found = np.array([[3.0, 0.0], [1.0, 1.0]], dtype=np.float32)  # row 0 same direction, row 1 at 45 degrees
    assert abs(_largest_cosine_distance(reference, found) - (1 - np.sqrt(0.5))) < 1e-6
