import pytest

from deployments.core.admission.admission import Admission, ClassLimits
from deployments.core.priority import Priority

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH

LIMITS = {
    RT: ClassLimits(max_queued_items=8),
    NORMAL: ClassLimits(max_queued_items=100, shed_above_queued_items=60),
    BATCH: ClassLimits(max_queued_items=100, shed_above_queued_items=30),
}


def queued(rt: int = 0, normal: int = 0, batch: int = 0) -> dict[Priority, int]:
    return {RT: rt, NORMAL: normal, BATCH: batch}


def test_every_class_needs_limits() -> None:
    with pytest.raises(ValueError, match="batch"):
        Admission({RT: LIMITS[RT], NORMAL: LIMITS[NORMAL]})


def test_everything_is_admitted_on_an_idle_model() -> None:
    admission = Admission(LIMITS)
    for priority in Priority:
        assert admission.check(priority, 1, queued(), items_per_s=10) is None


def test_as_the_total_queue_grows_batch_is_shed_first_then_normal_never_realtime() -> None:
    admission = Admission(LIMITS)
    refused_at: dict[Priority, int] = {}
    for total in range(0, 200):
        # the queue is made of realtime work, so no class hits its own bound but realtime
        depth = queued(normal=total)
        for priority in (NORMAL, BATCH):
            if priority not in refused_at and admission.check(priority, 1, depth, 10):
                refused_at[priority] = total
    assert refused_at == {BATCH: 30, NORMAL: 60}  # batch first, at its lower threshold
    assert admission.check(RT, 1, queued(normal=10_000, batch=10_000), 10) is None


def test_a_shed_request_gets_429_with_the_work_ahead_and_the_threshold() -> None:
    refusal = Admission(LIMITS).check(BATCH, 2, queued(rt=5, normal=20, batch=4), 10)
    assert refusal is not None
    assert (refusal.reason, refusal.status) == ("shed", 429)
    assert (refusal.queued_items, refusal.limit) == (29, 30)


def test_shedding_counts_every_class_queued_for_the_model() -> None:
    admission = Admission(LIMITS)
    assert admission.check(BATCH, 1, queued(rt=29), 10) is None
    assert admission.check(BATCH, 1, queued(rt=30), 10) is not None
    assert admission.check(BATCH, 1, queued(rt=10, normal=10, batch=10), 10) is not None


def test_realtime_is_refused_only_at_its_own_bound_with_503() -> None:
    admission = Admission(LIMITS)
    assert admission.check(RT, 1, queued(rt=7, normal=500, batch=500), 10) is None
    refusal = admission.check(RT, 1, queued(rt=8), 10)
    assert refusal is not None
    assert (refusal.reason, refusal.status) == ("queue_full", 503)
    assert (refusal.queued_items, refusal.limit) == (8, 8)


def test_normal_and_batch_at_their_own_bound_get_429_queue_full() -> None:
    limits = {**LIMITS, BATCH: ClassLimits(max_queued_items=10, shed_above_queued_items=1000)}
    refusal = Admission(limits).check(BATCH, 3, queued(batch=8), 10)
    assert refusal is not None
    assert (refusal.reason, refusal.status, refusal.limit) == ("queue_full", 429, 10)
    assert Admission(limits).check(BATCH, 2, queued(batch=8), 10) is None  # exactly at bound


def test_the_own_bound_is_checked_before_shedding() -> None:
    limits = {**LIMITS, BATCH: ClassLimits(max_queued_items=10, shed_above_queued_items=5)}
    refusal = Admission(limits).check(BATCH, 1, queued(batch=10), 10)
    assert refusal is not None and refusal.reason == "queue_full"


def test_a_big_request_is_admitted_when_its_queue_is_empty() -> None:
    admission = Admission(LIMITS)
    assert admission.check(RT, 50, queued(), 10) is None  # own bound is 8
    assert admission.check(BATCH, 500, queued(), 10) is None  # shed threshold is 30
    # ... but once anything waits the same request is refused
    assert admission.check(RT, 50, queued(rt=1), 10) is not None
    assert admission.check(BATCH, 500, queued(normal=1), 10) is not None


def test_a_big_request_with_its_own_queue_empty_can_still_be_shed_under_load() -> None:
    refusal = Admission(LIMITS).check(BATCH, 500, queued(normal=1), 10)
    assert refusal is not None and refusal.reason == "shed"


@pytest.mark.parametrize(
    ("depth", "size", "items_per_s", "retry_after"),
    [
        (queued(rt=8), 2, 5.0, 2),  # (8 + 2) / 5
        (queued(rt=8), 2, 3.0, 4),  # ceil(10 / 3)
        (queued(rt=8), 1, 1000.0, 1),  # never below one second
        (queued(rt=8), 1, 0.0, 1),  # no recent throughput: one second
        (queued(rt=8), 1, 0.01, 10),  # capped: the rate may be stale
    ],
)
def test_retry_after_comes_from_the_depth_ahead_and_the_recent_rate(
    depth: dict[Priority, int], size: int, items_per_s: float, retry_after: int
) -> None:
    refusal = Admission(LIMITS).check(RT, size, depth, items_per_s)
    assert refusal is not None and refusal.retry_after_s == retry_after


def test_retry_after_for_a_shed_request_counts_everything_queued() -> None:
    refusal = Admission(LIMITS).check(NORMAL, 10, queued(rt=20, normal=20, batch=30), 20)
    assert refusal is not None and refusal.reason == "shed"
    assert refusal.retry_after_s == 4  # (70 + 10) / 20


def test_a_class_without_a_shed_threshold_is_never_shed() -> None:
    limits = {**LIMITS, NORMAL: ClassLimits(max_queued_items=100)}
    assert Admission(limits).check(NORMAL, 1, queued(rt=10**6, batch=10**6), 1) is None


def test_missing_classes_in_the_depth_count_as_empty() -> None:
    assert Admission(LIMITS).check(BATCH, 1, {NORMAL: 5}, 10) is None
