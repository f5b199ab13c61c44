import pytest

from deployments.core.admission.held_requests import HeldRequests
from deployments.core.priority import Priority

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


def test_each_class_may_fill_its_share_higher_classes_keep_the_rest() -> None:
    held = HeldRequests(100)
    held.held = 49
    assert held.check(BATCH) is None
    held.held = 50
    refusal = held.check(BATCH)
    assert refusal is not None
    assert (refusal.reason, refusal.status, refusal.retry_after_s) == ("held", 429, 1)
    assert (refusal.queued_items, refusal.limit) == (50, 50)
    assert held.check(NORMAL) is None
    held.held = 85
    assert held.check(NORMAL) is not None
    assert held.check(RT) is None
    held.held = 100
    realtime = held.check(RT)
    assert realtime is not None and realtime.status == 503
    assert held.report()["refused"] == {"realtime": 1, "normal": 1, "batch": 1}


def test_holding_counts_until_the_block_ends_even_on_failure() -> None:
    held = HeldRequests(2)
    with held.holding():
        assert held.held == 1
    with pytest.raises(RuntimeError), held.holding():
        raise RuntimeError("model failed")
    assert held.held == 0


def test_a_tiny_limit_still_admits_one_of_each_class() -> None:
    held = HeldRequests(1)
    assert all(held.check(p) is None for p in Priority)
    with pytest.raises(ValueError):
        HeldRequests(0)
