"""``ragcache bench soak``'s verdict: a series that grows as fast at the end as at the start has not levelled off;
one that fills, then stays, has (issue 38, item 18)."""

from __future__ import annotations

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
    assert not grown.levelled_off and grown.first_third_mib_per_min == grown.last_third_mib_per_min == 30.0
    assert levelled("redis", times, [5 * MIB + int(t * MIB / 120) for t in times]).levelled_off  # 0.5 MiB/min: flat
