"""RecentRequests: the rates and percentiles behind /v1/stats, on a fake clock."""

from __future__ import annotations

from deployments.core.metrics.live_stats import RecentRequests, percentile
from tests.fakes import Clock


def test_nearest_rank_percentiles() -> None:
    ordered = [float(n) for n in range(1, 101)]
    assert percentile(ordered, 0.5) == 50
    assert percentile(ordered, 0.99) == 99
    assert percentile([0.2], 0.99) == 0.2
    assert percentile([], 0.5) is None


def test_rates_and_percentiles_cover_answered_requests_in_the_window() -> None:
    clock = Clock(100.0)
    recent = RecentRequests(window_s=10, clock=clock)
    clock.now += 20  # running for a while
    for n in range(10):
        recent.add(latency_s=0.01 * (n + 1), items=3, ok=True)
    recent.add(latency_s=9.0, items=5, ok=False)  # a 504: counted, not in the latency
    summary = recent.summary()
    assert (summary["requests"], summary["errors"]) == (11, 1)
    assert summary["requests_per_s"] == 1.0  # 10 answered over a 10 s window
    assert summary["items_per_s"] == 3.0
    assert (summary["p50_ms"], summary["p99_ms"]) == (50.0, 100.0)
    clock.now += 11  # all of them out of the window; the counts stay
    later = recent.summary()
    assert (later["requests"], later["requests_per_s"], later["p50_ms"]) == (11, 0.0, None)


def test_a_young_window_and_a_full_buffer_measure_over_the_span_they_cover() -> None:
    clock = Clock(100.0)
    recent = RecentRequests(window_s=30, max_samples=4, clock=clock)
    clock.now += 2
    recent.add(0.1, 1, ok=True)
    assert recent.summary()["requests_per_s"] == 0.5  # 1 request in the 2 s since start
    for _ in range(4):
        clock.now += 0.5
        recent.add(0.1, 1, ok=True)
    # Only the last 4 are kept, spanning 1.5 s (rates are floored at a 1 s span)...
    clock.now += 0.5
    assert recent.summary()["requests_per_s"] == 2.0  # ... 4 over the 2 s they cover
