import pytest

from deployments.core.admission.lateness import OpenLateness
from deployments.core.priority import Priority

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH
WINDOWS = {RT: 1.0, NORMAL: 1.0, BATCH: 60.0}


def test_nothing_open_or_nothing_late_is_no_lateness() -> None:
    late = OpenLateness(WINDOWS)
    assert late.late_s(NORMAL, 10.0) == pytest.approx(0.0)
    late.admitted(NORMAL, 10.0, predicted_s=0.2)
    assert late.late_s(NORMAL, 10.1) == pytest.approx(0.0)


def test_the_oldest_open_request_past_its_prediction_sets_the_lateness() -> None:
    late = OpenLateness(WINDOWS)
    first = late.admitted(NORMAL, 10.0, predicted_s=0.05)
    late.admitted(NORMAL, 10.1, predicted_s=0.3)
    assert late.late_s(NORMAL, 10.25) == pytest.approx(0.2)  # the first was due at 10.05
    late.closed(NORMAL, first)
    assert late.late_s(NORMAL, 10.25) == pytest.approx(0.0)  # the second is due at 10.4
    assert late.late_s(NORMAL, 10.5) == pytest.approx(0.1)


def test_a_late_class_above_delays_the_classes_below_it_not_above() -> None:
    late = OpenLateness(WINDOWS)
    late.admitted(NORMAL, 10.0, predicted_s=0.1)
    assert late.late_s(BATCH, 10.4) == pytest.approx(0.3)
    assert late.late_s(NORMAL, 10.4) == pytest.approx(0.3)
    assert late.late_s(RT, 10.4) == pytest.approx(0.0)
    late.admitted(RT, 10.3, predicted_s=0.0)
    assert late.late_s(BATCH, 10.4) == pytest.approx(0.3)  # the larger of the two


def test_a_request_open_past_its_class_window_stops_counting() -> None:
    late = OpenLateness(WINDOWS)
    stuck = late.admitted(NORMAL, 10.0, predicted_s=0.1)
    late.admitted(NORMAL, 10.8, predicted_s=0.1)
    assert late.late_s(NORMAL, 10.95) == pytest.approx(0.85)
    # Past the 1 s window the stuck one is the deadline's to end: the next one counts.
    assert late.late_s(NORMAL, 11.05) == pytest.approx(0.15)
    assert late.open_count() == 1
    late.closed(NORMAL, stuck)  # closing one already dropped is harmless
    assert late.open_count() == 1


def test_tokens_are_unique_across_classes() -> None:
    late = OpenLateness(WINDOWS)
    tokens = {late.admitted(p, 1.0, 0.1) for p in (RT, NORMAL, BATCH, NORMAL)}
    assert len(tokens) == 4
