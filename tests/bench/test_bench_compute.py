"""``ragcache bench compute``'s verdict logic: the headline weighs float32 against float32 over HTTP, a peer
that did not run fails it instead of flattering it, int8 is reported apart with its cosine distance; the cosine
distance itself."""

from __future__ import annotations

import numpy as np

from ragcache_bench.compute import FASTEMBED, INFINITY_ONNX, INFINITY_TORCH, _largest_cosine_distance, in_process, like_for_like
from ragcache_bench.report import BenchResult

OURS = {"ragcache torch": 100.0, "ragcache onnx": 150.0, "ragcache onnx-int8": 240.0}
CLOSE = {"ragcache torch": 0.0, "ragcache onnx": 1e-7, "ragcache onnx-int8": 0.02, FASTEMBED: 1e-7,
         INFINITY_TORCH: 1e-7, INFINITY_ONNX: 1e-7}
HEADLINE = "like for like: ragcache / fastest peer, float32 over HTTP"


def figures_of(fill) -> dict:
    result = BenchResult("compute", "test")
    fill(result)
    return {figure.name: figure for figure in result.figures}


def test_the_headline_is_ragcache_float32_against_the_fastest_peer_over_http():
    figures = figures_of(lambda r: like_for_like(r, {"ragcache": 60.0, INFINITY_TORCH: 40.0, INFINITY_ONNX: 50.0},
                                                 "onnx", all_computed=True))
    headline = figures[HEADLINE]
    assert headline.value == 60.0 / 50.0 and headline.verdict == "PASS"
    assert INFINITY_ONNX in headline.note and "onnx" in headline.note


def test_slower_than_a_peer_is_a_miss():
    figures = figures_of(lambda r: like_for_like(r, {"ragcache": 45.0, INFINITY_TORCH: 40.0, INFINITY_ONNX: 50.0},
                                                 "torch", all_computed=True))
    assert figures[HEADLINE].verdict == "MISS"


def test_a_peer_that_did_not_run_or_a_text_not_computed_fails_the_headline():
    figures = figures_of(lambda r: like_for_like(r, {"ragcache": 90.0, INFINITY_TORCH: 40.0}, "onnx", all_computed=True))
    assert figures[HEADLINE].verdict == "MISS" and figures[HEADLINE].failed_requirements == ["Infinity optimum ran"]
    figures = figures_of(lambda r: like_for_like(r, {"ragcache": 90.0, INFINITY_TORCH: 40.0, INFINITY_ONNX: 50.0},
                                                 "onnx", all_computed=False))
    assert figures[HEADLINE].failed_requirements == ["every ragcache text computed"]


def test_in_process_reports_float32_and_int8_apart_without_a_verdict():
    figures = figures_of(lambda r: in_process(r, {**OURS, FASTEMBED: 160.0, INFINITY_TORCH: 120.0}, CLOSE))
    float32 = figures["in process: ragcache best float32 / fastest peer"]
    assert float32.value == 150.0 / 160.0 and float32.verdict == ""
    int8 = figures["int8: ragcache onnx-int8 / fastest peer"]
    assert int8.value == 240.0 / 160.0 and int8.verdict == "" and "0.020" in int8.note


def test_largest_cosine_distance_ignores_length_and_finds_the_worst_row():
    reference = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    found = np.array([[3.0, 0.0], [1.0, 1.0]], dtype=np.float32)  # row 0 same direction, row 1 at 45 degrees
    assert abs(_largest_cosine_distance(reference, found) - (1 - np.sqrt(0.5))) < 1e-6
