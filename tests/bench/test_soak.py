"""``ragcache bench soak``'s verdict: a series that grows as fast at the end as at the start has not levelled off;
one that fills, then stays, has; one still growing slowly at the end has not, however fast it grew before (issue 38,
item 18). And its bounded corpus."""

from __future__ import annotations

from ragcache_bench.load import Workload
from ragcache_bench.soak import levelled, slope_mib_per_min

MIB = 2**20


def test_the_slope_is_in_mib_per_minute():
    times = [0.0, 30.0, 60.0, 90.0]
    assert slope_mib_per_min(times, [0, MIB, 2 * MIB, 3 * MIB]) == 2.0
    assert slope_mib_per_min([0.0], [MIB]) == 0.0


def test_a_cache_that_fills_then_stops_levels_off_and_one_that_keeps_growing_does_not():
    times = [float(t) for t in range(0, 120, 5)]
    filling = [min(t, 40) * MIB // 2 for t in times]  # +15 MiB/min until 40 s, then flat
    steady = [int(t * MIB / 2) for t in times]  # +30 MiB/min to the end: a leak, or a cache without a bound
    assert levelled("worker", times, filling).levelled_off
    grown = levelled("worker", times, steady)
    assert not grown.levelled_off and grown.first_half_mib_per_min == grown.last_half_mib_per_min == 30.0
    assert levelled("redis", times, [5 * MIB + int(t * MIB / 120) for t in times]).levelled_off  # 0.5 MiB/min: flat


def test_a_series_still_growing_slowly_at_the_end_has_not_levelled_off_however_fast_it_grew_before():
    # The last r10 soak: memos still filling at +1.4 MiB/min after +20 at the start were called levelled off
    # (a third of the first rate): growth at the end is what a bound that does not hold looks like.
    times = [float(t) for t in range(0, 480, 10)]
    slowing = [int((20 * min(t, 60) + 1.4 * max(t - 60, 0)) / 60 * MIB) for t in times]
    series = levelled("worker", times, slowing)
    assert series.last_half_mib_per_min == 1.4 and not series.levelled_off


def test_a_bounded_workload_sends_only_its_corpus():
    workload = Workload(seed=3, num_hot=5, new_fraction=0.5, num_new=7, paths=("/embed",))
    corpus = workload.corpus()
    assert len(set(corpus)) == 12
    sent = {text for _ in range(200) for text in workload.next_request()[1]["inputs"]}
    assert sent == set(corpus)  # every text comes round, none beyond the corpus
