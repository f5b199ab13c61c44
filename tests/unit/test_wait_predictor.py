import random
from collections.abc import Callable

import pytest

from deployments.core.admission.admission import wait_refusal
from deployments.core.admission.busy_rate import BusyRate
from deployments.core.admission.wait_predictor import (
    COLD_START_WORK_PER_S,
    MAX_SLOPE,
    MIN_SLOPE,
    LatencyFit,
    Prediction,
    WaitPredictor,
    fit_line,
)
from deployments.core.priority import Priority
from tests.fakes import Clock

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


def measured(
    items_per_s: float, floor_s: float, capacity: bool = True, clock: Clock | None = None
) -> WaitPredictor:
    """A predictor that has seen calls of 10 items at `items_per_s`, the fastest `floor_s`."""
    clock = clock or Clock()
    predictor = WaitPredictor(BusyRate(window_s=0.5, min_work=10, clock=clock), clock=clock)
    for _ in range(20):
        predictor.rate.started()
        clock.now += 10 / items_per_s
        predictor.rate.ended(10)
        predictor.call_took(10 / items_per_s)
    predictor.call_took(floor_s)
    if capacity:
        predictor.note_job(work=1, rows=1)
        predictor.set_capacity(items_per_s)  # the replica's figure agrees with the measure
    return predictor


def test_cold_start_assumes_a_slow_rate_and_teaches_the_fit_nothing() -> None:
    predictor = WaitPredictor(BusyRate(window_s=0.5, min_work=10, clock=Clock()))
    cold = predictor.predict(NORMAL, 1999, 1)
    assert cold.cold and cold.seconds == pytest.approx(2000 / COLD_START_WORK_PER_S)
    predictor.call_took(0.01)
    assert predictor.predict(NORMAL, 1999, 1).seconds == pytest.approx(0.01 + 1.0)
    for _ in range(64):  # however late, guesses move no fit
        predictor.observe(NORMAL, cold, 5.0)
    assert predictor.report()["fit"] == {"realtime": None, "normal": None, "batch": None}


def test_before_a_fit_the_prediction_is_the_floor_plus_the_queue_term() -> None:
    predictor = measured(items_per_s=200, floor_s=0.02)
    prediction = predictor.predict(NORMAL, ahead_work=99, work=1)
    assert prediction is not None
    assert prediction.queue_s == pytest.approx(100 / 200)
    assert prediction.seconds == pytest.approx(0.02 + 0.5)


def feed(
    predictor: WaitPredictor,
    priority: Priority,
    latency: Callable[[float], float],
    clock: Clock | None = None,
) -> None:
    """Admitted requests with 0 to 99 items ahead, each answered after latency(q), one
    every 50 ms of `clock` where one is given."""
    for k in range(300):
        if clock is not None:
            clock.now += 0.05
        prediction = predictor.predict(priority, k % 100, 1)
        assert prediction is not None
        predictor.observe(priority, prediction, latency(prediction.queue_s))


def test_answers_slower_than_the_rate_says_raise_the_slope() -> None:
    predictor = measured(items_per_s=200, floor_s=0.02)
    feed(predictor, NORMAL, lambda q: 0.02 + 3 * q)  # the model is a third as fast
    prediction = predictor.predict(NORMAL, 99, 1)
    assert prediction is not None and prediction.seconds == pytest.approx(0.02 + 1.5, rel=0.02)
    other = predictor.predict(BATCH, 99, 1)  # a class's fit is its own
    assert other is not None and other.seconds == pytest.approx(0.52)


def test_a_delay_every_request_pays_is_a_base_not_a_slope() -> None:
    clock = Clock()
    predictor = measured(items_per_s=200, floor_s=0.02, clock=clock)
    # over 15 s: the first answers, cut at four times the floor-plus-queue guess (below),
    # have faded by the end
    feed(predictor, NORMAL, lambda q: 0.3 + q, clock)  # a busy ingress: +300 ms for everyone
    short, long = predictor.predict(NORMAL, 0, 1), predictor.predict(NORMAL, 99, 1)
    assert short is not None and long is not None
    assert short.seconds == pytest.approx(0.305, abs=0.01)
    # what a single factor would have made of it: 0.3 / 0.025 = 12x on every queue
    assert long.seconds == pytest.approx(0.8, abs=0.01)


def test_the_tail_of_the_residuals_is_added() -> None:
    rng = random.Random(3)
    clock = Clock()
    predictor = measured(items_per_s=200, floor_s=0.02, clock=clock)
    feed(predictor, NORMAL, lambda q: 0.05 + q + rng.uniform(-0.1, 0.1), clock)
    prediction = predictor.predict(NORMAL, 49, 1)
    assert prediction is not None
    # uniform(-0.1, 0.1) has a standard deviation of 0.058: 1.28 of them on top
    assert prediction.seconds == pytest.approx(0.05 + 0.25 + 1.28 * 0.0577, abs=0.03)


def test_the_slope_stays_within_its_bounds_and_a_flat_queue_takes_the_rate_at_its_word() -> None:
    assert fit_line([(q / 100, 5.0 * q) for q in range(50)]).slope == MAX_SLOPE
    assert fit_line([(q / 100, 0.2) for q in range(50)]).slope == MIN_SLOPE
    flat = fit_line([(0.1, 0.3)] * 50)
    assert (flat.base_s, flat.slope, flat.spread_s) == pytest.approx((0.2, 1.0, 0.0))


def test_a_request_that_waited_out_its_deadline_counts_as_four_times_late() -> None:
    clock = Clock()
    predictor = measured(items_per_s=200, floor_s=0.02, clock=clock)
    feed(predictor, NORMAL, lambda q: 0.02 + q, clock)
    prediction = predictor.predict(NORMAL, 10, 1)
    assert prediction is not None
    for _ in range(20):
        clock.now += 0.1
        predictor.observe(NORMAL, prediction, 60.0)  # each a 60 s deadline
    after = predictor.predict(NORMAL, 10, 1)
    assert after is not None and prediction.seconds < after.seconds < 4


def test_within_budget_or_with_nothing_ahead_is_admitted() -> None:
    assert wait_refusal(NORMAL, Prediction(0.4, 0.4), budget_s=0.5, ahead_work=80) is None
    # a request with nothing ahead is never refused, however big: it would never be served
    assert wait_refusal(NORMAL, Prediction(5.0, 5.0), budget_s=0.5, ahead_work=0) is None


def test_over_budget_is_refused_with_retry_after_from_the_excess() -> None:
    refusal = wait_refusal(NORMAL, Prediction(2.6, 2.0), budget_s=0.5, ahead_work=400)
    assert refusal is not None
    assert (refusal.reason, refusal.status, refusal.retry_after_s) == ("wait", 429, 3)
    assert (refusal.queued_items, refusal.limit, refusal.predicted_ms) == (400, 500, 2600)
    realtime = wait_refusal(RT, Prediction(0.15, 0.15), budget_s=0.1, ahead_work=3)
    assert realtime is not None and (realtime.status, realtime.retry_after_s) == (503, 1)
    # a stale rate must not send clients away for minutes
    far = wait_refusal(BATCH, Prediction(500, 500), budget_s=30, ahead_work=10**5)
    assert far is not None and far.retry_after_s == 10


def test_a_deadline_already_past_refuses_with_a_positive_retry_after() -> None:
    refusal = wait_refusal(NORMAL, Prediction(0.3, 0.3), budget_s=-1.0, ahead_work=5)
    assert refusal is not None and refusal.retry_after_s == 1


def test_the_replicas_capacity_lifts_a_rate_measured_under_light_load() -> None:
    """A trickle measured 200 work/s; the replica says 100 inputs/s in full passes, and
    inputs here weigh 20: the prediction divides by 2,000, the better of the two."""
    predictor = measured(items_per_s=200, floor_s=0.02, capacity=False)
    predictor.note_job(work=200, rows=10)
    predictor.set_capacity(100.0)
    assert predictor.service_rate() == pytest.approx(2000)
    prediction = predictor.predict(NORMAL, ahead_work=1980, work=20)
    assert prediction is not None and prediction.queue_s == pytest.approx(1.0)
    report = predictor.report()
    assert report["capacity_inputs_per_s"] == 100.0 and report["service_rate_per_s"] == 2000
    # A capacity below what was measured leaves the measured rate.
    predictor.set_capacity(1.0)
    assert predictor.service_rate() == pytest.approx(200)


def test_the_measured_rate_serves_until_the_capacity_is_known() -> None:
    predictor = measured(items_per_s=200, floor_s=0.02, capacity=False)
    assert predictor.report()["capacity_inputs_per_s"] is None
    assert predictor.service_rate() == pytest.approx(200)
    assert predictor.predict(NORMAL, ahead_work=99, work=1) is not None


def test_a_fit_forgets_what_is_older_than_its_age_limit() -> None:
    """A stall taught the class that answers take 2 s; 30 s later what came since is the
    fit, as soon as there is enough of it; until then the last samples stand."""
    clock = Clock()
    fit = LatencyFit(min_samples=8, refit_every=1, max_age_s=30.0, clock=clock)
    for _ in range(8):
        fit.observe(0.1, 2.0)
    line = fit.line
    assert line is not None and line.predict_s(0.1) == pytest.approx(2.0, abs=0.1)
    clock.now += 31
    fit.observe(0.1, 0.15)
    line = fit.line  # one new sample: the latest eight, mostly the stall's, still decide
    assert line is not None and line.predict_s(0.1) > 1.0
    for _ in range(7):  # eight since the stall
        clock.now += 0.2
        fit.observe(0.1, 0.15)
    line = fit.line
    assert line is not None and line.predict_s(0.1) == pytest.approx(0.15, abs=0.05)


def test_the_margin_is_a_quantile_a_few_stalls_do_not_widen() -> None:
    samples = [(0.1 * (k % 10), 0.05 + 0.1 * (k % 10)) for k in range(100)]
    samples[:3] = [(0.0, 5.0)] * 3  # three answers caught in a stall
    line = fit_line(samples)
    assert line.spread_s < 0.5  # a deviation-based margin would be about 1.3 s


def test_a_capacity_alone_is_a_rate_before_anything_was_measured() -> None:
    predictor = WaitPredictor(BusyRate(window_s=0.5, min_work=10, clock=Clock()))
    predictor.note_job(work=30, rows=3)
    predictor.set_capacity(50.0)
    predictor.call_took(0.01)
    prediction = predictor.predict(NORMAL, ahead_work=490, work=10)
    assert prediction is not None and prediction.queue_s == pytest.approx(1.0)


def observe_for(
    fit: LatencyFit, clock: Clock, count: int, measured_s: float, every_s: float
) -> None:
    """`count` answers of `measured_s` with 0.1 s of queue, one every `every_s` of `clock`."""
    for _ in range(count):
        clock.now += every_s
        fit.observe(0.1, measured_s)


def test_a_fit_weighs_seconds_not_requests() -> None:
    """A second of flood taught the class 600 ms answers from 300 requests; the trickle it
    admits since (20 a second, 150 ms each) outweighs it within seconds, though it counts
    fewer requests: counted by requests, admission stayed shut long after the flood."""
    clock = Clock()
    fit = LatencyFit(clock=clock)
    observe_for(fit, clock, 300, 0.6, every_s=1 / 300)
    line = fit.line
    assert line is not None and line.predict_s(0.1) == pytest.approx(0.6, abs=0.01)
    observe_for(fit, clock, 120, 0.15, every_s=0.05)  # six seconds
    line = fit.line
    assert line is not None and line.predict_s(0.1) < 0.25


def test_a_fit_refits_on_time_while_its_class_admits_little() -> None:
    clock = Clock()
    fit = LatencyFit(min_samples=8, refit_every=16, clock=clock)
    observe_for(fit, clock, 16, 0.6, every_s=0.0)
    clock.now += 10.0
    # fewer than refit_every: only the fit's age refits it
    observe_for(fit, clock, 8, 0.15, every_s=0.0)
    line = fit.line
    assert line is not None and line.predict_s(0.1) < 0.25


def test_under_a_flood_a_fit_is_redone_at_most_every_tenth_of_a_second() -> None:
    clock = Clock()
    fit = LatencyFit(min_samples=8, refit_every=1, clock=clock)
    observe_for(fit, clock, 8, 0.6, every_s=0.0)
    first = fit.line
    observe_for(fit, clock, 20, 0.15, every_s=0.0)  # within the same moment: the fit stands
    assert fit.line == first
    observe_for(fit, clock, 1, 0.15, every_s=0.1)
    line = fit.line
    assert line is not None and line != first
