import random

import pytest

from deployments.core.admission import wait_refusal
from deployments.core.busy_rate import BusyRate
from deployments.core.priority import Priority
from deployments.core.wait_predictor import Prediction, RatioQuantile, WaitPredictor
from tests.fakes import Clock

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


def measured(items_per_s: float, floor_s: float) -> WaitPredictor:
    """A predictor that has seen calls of 10 items at `items_per_s`, the fastest `floor_s`."""
    clock = Clock()
    predictor = WaitPredictor(BusyRate(window_s=0.5, min_items=10, clock=clock))
    for _ in range(20):
        predictor.rate.started()
        clock.now += 10 / items_per_s
        predictor.rate.ended(10)
        predictor.call_took(10 / items_per_s)
    predictor.call_took(floor_s)
    return predictor


def test_cold_start_predicts_nothing() -> None:
    predictor = WaitPredictor(BusyRate(window_s=0.5, min_items=10, clock=Clock()))
    assert predictor.predict(NORMAL, 100, 1) is None
    predictor.call_took(0.01)
    assert predictor.predict(NORMAL, 100, 1) is None  # a floor, but no rate yet


def test_prediction_is_the_floor_plus_the_work_ahead_and_its_own_over_the_rate() -> None:
    predictor = measured(items_per_s=200, floor_s=0.02)
    prediction = predictor.predict(NORMAL, ahead_items=99, size=1)
    assert prediction is not None
    assert prediction.raw_s == pytest.approx(0.02 + 100 / 200)
    assert prediction.seconds == pytest.approx(prediction.raw_s)  # no correction yet


def test_late_answers_raise_the_correction_fast_early_ones_lower_it_slowly() -> None:
    predictor = measured(items_per_s=200, floor_s=0.02)
    prediction = predictor.predict(NORMAL, 99, 1)
    assert prediction is not None
    for _ in range(30):
        predictor.observe(NORMAL, prediction, 3 * prediction.raw_s)
    late = predictor.predict(NORMAL, 99, 1)
    assert late is not None and late.seconds == pytest.approx(3 * late.raw_s, rel=0.1)
    for _ in range(10):
        predictor.observe(NORMAL, prediction, 0.5 * prediction.raw_s)
    after = predictor.predict(NORMAL, 99, 1)
    assert after is not None and after.seconds > 2.5 * after.raw_s  # 10 early ones: little
    for _ in range(200):
        predictor.observe(NORMAL, prediction, 0.5 * prediction.raw_s)
    settled = predictor.predict(NORMAL, 99, 1)
    assert settled is not None and settled.seconds < 0.6 * settled.raw_s
    # and a class's correction is its own
    other = predictor.predict(BATCH, 99, 1)
    assert other is not None and other.seconds == pytest.approx(other.raw_s)


def test_the_correction_settles_at_its_quantile_of_the_ratios() -> None:
    rng = random.Random(7)
    tracker = RatioQuantile(quantile=0.9, step=0.02)
    ratios = [rng.uniform(0.5, 2.5) for _ in range(40_000)]
    for ratio in ratios:
        tracker.observe(ratio)
    assert tracker.value == pytest.approx(2.3, abs=0.1)  # the 90th percentile of U(0.5, 2.5)


def test_the_correction_stays_within_its_bounds() -> None:
    tracker = RatioQuantile(low=0.5, high=4)
    for _ in range(1000):
        tracker.observe(1000)
    assert tracker.value == 4
    for _ in range(100_000):
        tracker.observe(0)
    assert tracker.value == 0.5


def test_within_budget_or_with_nothing_ahead_is_admitted() -> None:
    assert wait_refusal(NORMAL, Prediction(0.4, 0.4), budget_s=0.5, ahead_items=80) is None
    # a request with nothing ahead is never refused, however big: it would never be served
    assert wait_refusal(NORMAL, Prediction(5.0, 5.0), budget_s=0.5, ahead_items=0) is None


def test_over_budget_is_refused_with_retry_after_from_the_excess() -> None:
    refusal = wait_refusal(NORMAL, Prediction(2.6, 2.0), budget_s=0.5, ahead_items=400)
    assert refusal is not None
    assert (refusal.reason, refusal.status, refusal.retry_after_s) == ("wait", 429, 3)
    assert (refusal.queued_items, refusal.limit, refusal.predicted_ms) == (400, 500, 2600)
    realtime = wait_refusal(RT, Prediction(0.15, 0.15), budget_s=0.1, ahead_items=3)
    assert realtime is not None and (realtime.status, realtime.retry_after_s) == (503, 1)
    # a stale rate must not send clients away for minutes
    far = wait_refusal(BATCH, Prediction(500, 500), budget_s=30, ahead_items=10**5)
    assert far is not None and far.retry_after_s == 10


def test_a_deadline_already_past_refuses_with_a_positive_retry_after() -> None:
    refusal = wait_refusal(NORMAL, Prediction(0.3, 0.3), budget_s=-1.0, ahead_items=5)
    assert refusal is not None and refusal.retry_after_s == 1
