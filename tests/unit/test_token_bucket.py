import pytest

from deployments.core.access.token_bucket import TokenBucket
from tests.fakes import Clock


def bucket(rate: float = 10.0, burst: float = 5.0) -> tuple[TokenBucket, Clock]:
    clock = Clock(100.0)
    return TokenBucket(rate, burst, clock=clock), clock


def test_a_new_bucket_is_full_up_to_its_burst() -> None:
    b, _ = bucket(rate=10, burst=5)
    assert b.wait_for(5) == 0.0
    for _ in range(5):
        assert b.wait_for(1) == 0.0
        b.take(1)
    assert b.wait_for(1) == pytest.approx(0.1)


def test_tokens_refill_at_the_rate() -> None:
    b, clock = bucket(rate=8, burst=5)  # binary fractions: exact sums
    b.take(5)
    assert b.wait_for(2) == 0.25
    clock.now += 0.125
    assert b.wait_for(2) == 0.125
    clock.now += 0.125
    assert b.wait_for(2) == 0.0


def test_refill_stops_at_the_burst() -> None:
    b, clock = bucket(rate=10, burst=5)
    clock.now += 3600
    b.take(5)
    assert b.wait_for(1) == pytest.approx(0.1)  # an hour idle saved no more than the burst


def test_a_take_larger_than_the_burst_waits_for_a_full_bucket_then_leaves_debt() -> None:
    b, clock = bucket(rate=10, burst=5)
    b.take(2)
    # 3 left; asking for 50 only waits for the bucket to be full, not for 50 tokens.
    assert b.wait_for(50) == pytest.approx(0.2)
    clock.now += 0.2
    assert b.wait_for(50) == 0.0
    b.take(50)  # 5 - 50 = 45 in debt
    assert b.wait_for(1) == pytest.approx(4.6)  # (1 + 45) / 10
    clock.now += 4.5
    assert b.wait_for(1) == pytest.approx(0.1)


def test_give_back_corrects_an_estimate_but_never_above_the_burst() -> None:
    b, _ = bucket(rate=1, burst=10)
    b.take(8)  # estimated 8, used 3
    b.give_back(5)
    assert b.wait_for(7) == 0.0
    assert b.wait_for(8) == pytest.approx(1.0)
    b.give_back(100)
    assert b.wait_for(10) == 0.0
    b.take(10)
    assert b.wait_for(10) == pytest.approx(10.0)


def test_a_negative_give_back_charges_more() -> None:
    b, _ = bucket(rate=2, burst=4)
    b.take(1)  # estimated 1, used 5
    b.give_back(-4)
    assert b.wait_for(1) == pytest.approx(1.0)  # level -1: 2 tokens missing at 2/s


def test_time_passed_before_a_take_counts() -> None:
    b, clock = bucket(rate=10, burst=5)
    b.take(5)
    clock.now += 0.3
    b.take(3)
    assert b.wait_for(1) == pytest.approx(0.1)


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (1, 0), (-1, 1), (1, -5)])
def test_rate_and_burst_must_be_positive(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst)
