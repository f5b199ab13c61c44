"""The canary guard: trips on error rate, p99 or agreement against the primary."""

from __future__ import annotations

import numpy as np

from deployments.core.rollout.agreement import (
    embedding_agreement,
    exact_match,
    rank_correlation,
    top1_agreement,
)
from deployments.core.rollout.rollout_guard import GuardRules, RolloutGuard
from tests.fakes import Clock


def _guard(**rules: float | None) -> tuple[RolloutGuard, Clock]:
    clock = Clock()
    settings = {"window_s": 60.0, "min_requests": 10, **rules}
    return RolloutGuard(GuardRules(**settings), primary="1", clock=clock), clock  # type: ignore[arg-type]


def test_a_canary_failing_more_than_the_margin_is_tripped() -> None:
    guard, _ = _guard(max_error_rate_increase=0.05)
    for _ in range(20):
        assert guard.record("1", True, 0.01) is None
    trips = [guard.record("2", i % 4 != 0, 0.01) for i in range(20)]
    trip = next(t for t in trips if t is not None)
    assert trip.version == "2" and trip.reason == "error_rate"
    assert "2" in guard.tripped
    assert guard.snapshot()["2"]["tripped"] is not None


def test_the_guard_waits_for_enough_answers() -> None:
    guard, _ = _guard(max_error_rate_increase=0.0)
    for _ in range(9):
        guard.record("1", True, 0.01)
        assert guard.record("2", False, 0.01) is None  # 9 < min_requests


def test_a_slow_canary_is_tripped_on_p99() -> None:
    guard, _ = _guard(max_p99_ratio=2.0)
    for _ in range(20):
        guard.record("1", True, 0.010)
    trips = [guard.record("2", True, 0.050) for _ in range(20)]
    assert any(t is not None and t.reason == "p99" for t in trips)


def test_a_canary_as_good_as_the_primary_is_never_tripped() -> None:
    guard, _ = _guard()
    for i in range(200):
        guard.record("1", i % 50 != 0, 0.01 + (i % 7) / 1000)
        assert guard.record("2", i % 50 != 1, 0.01 + (i % 5) / 1000) is None
    assert guard.tripped == {}


def test_low_shadow_agreement_trips() -> None:
    guard, _ = _guard(min_agreement=0.99)
    trips = [guard.record_agreement("2", 0.9) for _ in range(10)]
    assert trips[-1] is not None and trips[-1].reason == "agreement"


def test_old_answers_leave_the_window() -> None:
    guard, clock = _guard(max_error_rate_increase=0.05)
    for _ in range(20):
        guard.record("1", True, 0.01)
    for _ in range(9):
        assert guard.record("2", False, 0.01) is None  # too few to judge yet
    clock.now += 120  # those failures leave the window
    for _ in range(20):
        guard.record("1", True, 0.01)
        assert guard.record("2", True, 0.01) is None
    assert guard.snapshot()["1"]["requests"] == 20


def test_agreement_measures() -> None:
    a = np.eye(3, dtype=np.float32)
    assert embedding_agreement(a, a) == 1.0
    b = a.copy()
    b[2] = [0, 1, 0]
    assert embedding_agreement(a, b) == 0.0  # the worst vector shows
    assert embedding_agreement(a, a[:, :2]) == 0.0
    assert top1_agreement([0.1, 0.9, 0.3], [0.2, 0.8, 0.1]) == 1.0
    assert top1_agreement([0.1, 0.9], [0.9, 0.1]) == 0.0
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert rank_correlation([0.5], [0.1]) == 1.0
    assert exact_match("abc", "abc") == 1.0 and exact_match("abc", "abd") == 0.0
