"""passes_in_flight: auto's measurement, with fake forwards whose time is a fake clock's."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from deployments.backends.runtimes.passes import MIN_GAIN, choose_passes


class SharedClock:
    """Advances only when a fake pass runs: `cost(size, side_by_side)` seconds per pass,
    counted once for passes that run together (they overlap)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.now


def forward_costing(clock: SharedClock, seconds: float, overlapping: int) -> Any:
    def forward(batch: list[int]) -> np.ndarray:
        with clock.lock:  # n overlapping passes advance the clock by one pass's time
            clock.now += seconds / overlapping
        return np.zeros((len(batch), 2))

    return forward


def test_keeps_side_by_side_passes_when_they_finish_more_texts() -> None:
    clock = SharedClock()
    threads_seen: list[int] = []
    choice = choose_passes(
        single=forward_costing(clock, 0.010, 1),
        side_by_side=forward_costing(clock, 0.012, 2),  # each slower, two at once: 1.67x
        passes=2,
        threads=2,
        batches={1: [0], 8: [0] * 8},
        set_threads=threads_seen.append,
        rounds=2,
        clock=clock,
    )
    assert choice.passes == 2
    assert "1.67x" in choice.reason and "1 thread(s) each" in choice.reason
    assert sorted(threads_seen) == [1, 1, 2]  # the single pass's thread got both
    report = choice.report()
    assert report["passes_in_flight"] == 2
    assert set(report["passes_texts_per_s"]) == {"1", "2"}


def test_a_small_gain_keeps_one_pass() -> None:
    clock = SharedClock()
    # Two at once each take twice as long: no gain.
    choice = choose_passes(
        single=forward_costing(clock, 0.010, 1),
        side_by_side=forward_costing(clock, 0.020 * (MIN_GAIN - 0.02) / MIN_GAIN, 2),
        passes=2,
        threads=2,
        batches={4: [0] * 4},
        set_threads=lambda n: None,
        rounds=2,
        clock=clock,
    )
    assert choice.passes == 1
    assert "one pass on 2 threads" in choice.reason
