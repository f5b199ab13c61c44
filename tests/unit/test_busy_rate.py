import pytest

from deployments.core.busy_rate import BusyRate
from tests.fakes import Clock


def calls(rate: BusyRate, clock: Clock, n: int, items: int, seconds: float) -> None:
    for _ in range(n):
        rate.started()
        clock.now += seconds
        rate.ended(items)


def test_no_rate_until_enough_items_were_measured() -> None:
    clock = Clock()
    rate = BusyRate(min_items=10, clock=clock)
    calls(rate, clock, 2, 4, 0.1)
    assert rate.per_s() is None
    calls(rate, clock, 1, 4, 0.1)
    assert rate.per_s() == pytest.approx(12 / 0.3)


def test_idle_time_between_calls_is_not_service_time() -> None:
    clock = Clock()
    rate = BusyRate(min_items=1, clock=clock)
    for _ in range(5):
        calls(rate, clock, 1, 10, 0.1)
        clock.now += 10  # a quiet server: one call every 10 s
    assert rate.per_s() == pytest.approx(100)  # 10 items per 0.1 busy s, not 1 item/s of wall time


def test_overlapping_calls_count_their_union_once() -> None:
    clock = Clock()
    rate = BusyRate(min_items=1, clock=clock)
    rate.started()
    clock.now += 0.1
    rate.started()  # a second call while the first is out
    clock.now += 0.1
    rate.ended(10)
    clock.now += 0.2
    rate.ended(30)
    assert rate.per_s() == pytest.approx(40 / 0.4)


def test_the_window_follows_a_change_of_speed() -> None:
    clock = Clock()
    rate = BusyRate(window_s=1.0, min_items=1, clock=clock)
    calls(rate, clock, 50, 10, 0.1)  # 100 items/s
    calls(rate, clock, 20, 5, 0.1)  # half as fast, for 2 busy s
    per_s = rate.per_s()
    assert per_s is not None and 49 < per_s < 56


def test_failed_calls_count_busy_time_without_items() -> None:
    clock = Clock()
    rate = BusyRate(min_items=1, clock=clock)
    calls(rate, clock, 1, 10, 0.1)
    calls(rate, clock, 1, 0, 0.1)
    assert rate.per_s() == pytest.approx(10 / 0.2)


def test_an_unmatched_end_is_ignored() -> None:
    clock = Clock()
    rate = BusyRate(min_items=1, clock=clock)
    rate.ended(10)
    assert rate.per_s() is None
