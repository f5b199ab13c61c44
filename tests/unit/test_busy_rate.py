import pytest

from deployments.core.admission.busy_rate import BusyRate
from tests.fakes import Clock


def calls(rate: BusyRate, clock: Clock, n: int, items: int, seconds: float) -> None:
    for _ in range(n):
        rate.started()
        clock.now += seconds
        rate.ended(items)


def make(**options: float) -> tuple[BusyRate, Clock]:
    clock = Clock()
    return BusyRate(clock=clock, **options), clock  # type: ignore[arg-type]


def test_no_rate_until_a_window_of_busy_time_closed_with_enough_items() -> None:
    rate, clock = make(window_s=1.0, min_work=16)
    calls(rate, clock, 7, 2, 0.125)
    assert rate.per_s() is None
    calls(rate, clock, 1, 2, 0.125)
    assert rate.per_s() == pytest.approx(16 / 1.0)


def test_a_window_with_too_few_items_is_not_a_rate() -> None:
    rate, clock = make(window_s=1.0, min_work=10)
    calls(rate, clock, 1, 1, 1.0)  # one item in a second: a failing or idle model
    assert rate.per_s() is None


def test_idle_time_between_calls_is_not_service_time() -> None:
    rate, clock = make(window_s=0.5, min_work=1)
    for _ in range(5):
        calls(rate, clock, 1, 10, 0.1)
        clock.now += 10  # a quiet server: one call every 10 s
    assert rate.per_s() == pytest.approx(100)  # 10 items per 0.1 busy s, not 1/s


def test_overlapping_calls_count_their_union_once() -> None:
    rate, clock = make(window_s=0.4, min_work=1)
    rate.started()
    clock.now += 0.1
    rate.started()  # a second call while the first is out
    clock.now += 0.1
    rate.ended(10)
    clock.now += 0.2
    rate.ended(30)
    assert rate.per_s() == pytest.approx(40 / 0.4)


def test_the_best_recent_window_is_the_rate_until_it_ages_out() -> None:
    rate, clock = make(window_s=1.0, horizon=3, min_work=1)
    calls(rate, clock, 8, 25, 0.125)  # full batches: 200 items/s
    calls(rate, clock, 16, 5, 0.125)  # small ones: 40 items/s, two windows
    assert rate.per_s() == pytest.approx(200)  # not what a short queue lets it show
    calls(rate, clock, 8, 5, 0.125)  # a third slow window pushes the fast one out
    assert rate.per_s() == pytest.approx(40)


def test_failed_calls_count_busy_time_without_items() -> None:
    rate, clock = make(window_s=0.2, min_work=1)
    calls(rate, clock, 1, 10, 0.1)
    calls(rate, clock, 1, 0, 0.1)
    assert rate.per_s() == pytest.approx(10 / 0.2)


def test_an_unmatched_end_is_ignored() -> None:
    rate, _ = make(min_work=1)
    rate.ended(10)
    assert rate.per_s() is None
