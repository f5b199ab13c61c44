import pytest

from deployments.core.admission.throughput import RateMeter, retry_after_s
from tests.fakes import Clock


def test_no_events_means_no_known_rate() -> None:
    assert RateMeter(clock=Clock(50.0)).rate() == 0.0


def test_rate_is_units_over_the_span_of_the_window() -> None:
    clock = Clock(50.0)
    meter = RateMeter(window_s=10, clock=clock)
    for _ in range(5):
        meter.add(20)
        clock.now += 1
    # 100 units from t=50 to t=55
    assert meter.rate() == pytest.approx(20.0)


def test_a_span_shorter_than_a_second_counts_as_one_second() -> None:
    clock = Clock(50.0)
    meter = RateMeter(window_s=10, clock=clock)
    meter.add(30)
    clock.now += 0.01
    meter.add(30)
    assert meter.rate() == pytest.approx(60.0)  # not 6000/s from a 10 ms span


def test_events_older_than_the_window_are_forgotten() -> None:
    clock = Clock(50.0)
    meter = RateMeter(window_s=10, clock=clock)
    meter.add(1000)
    clock.now += 5
    meter.add(10)
    clock.now += 6  # the first event is 11 s old
    assert meter.rate() == pytest.approx(10 / 6)
    clock.now += 10
    assert meter.rate() == 0.0


@pytest.mark.parametrize(
    ("ahead", "per_second", "expected"),
    [
        (100, 50.0, 2),
        (101, 50.0, 3),  # rounded up to a whole second
        (1, 1000.0, 1),  # never less than one second
        (0, 10.0, 1),
        (10_000, 1.0, 60),  # capped at the ceiling
        (50, 0.0, 1),  # rate unknown
        (50, -1.0, 1),
    ],
)
def test_retry_after_is_the_time_to_drain_the_work_ahead(
    ahead: int, per_second: float, expected: int
) -> None:
    assert retry_after_s(ahead, per_second) == expected


def test_retry_after_ceiling_is_configurable() -> None:
    assert retry_after_s(10_000, 1.0, ceiling_s=5) == 5
    assert isinstance(retry_after_s(10_000, 1.0, ceiling_s=5.5), int)
