"""A replica's busy share: pass time over wall time since the last reading, per lane."""

from __future__ import annotations

import pytest

from deployments.core.batching.busy_share import BusyShare
from tests.fakes import Clock


def test_the_share_is_pass_time_over_the_period_and_each_reading_starts_a_new_one() -> None:
    clock = Clock()
    busy = BusyShare(clock=clock)
    busy.ran(0.3)
    busy.ran(0.2)
    clock.now += 2.0
    assert busy.read() == pytest.approx(0.25)
    clock.now += 1.0
    assert busy.read() == 0.0  # nothing ran since


def test_two_lanes_are_busy_only_when_both_run_and_a_long_pass_never_counts_past_one() -> None:
    clock = Clock()
    busy = BusyShare(lanes=2, clock=clock)
    busy.ran(1.0)
    clock.now += 1.0
    assert busy.read() == pytest.approx(0.5)
    busy.ran(5.0)  # began periods ago, ended in this one
    clock.now += 1.0
    assert busy.read() == 1.0
    assert busy.read() == 0.0  # no time passed: no share
