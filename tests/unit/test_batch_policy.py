"""The batch policy: no wait for a batch that will not fill, targets bound every class's
passes, ceilings hold until there is a fit; and the tuner applies it."""

from __future__ import annotations

import pytest

from deployments.core.batching.batch_policy import (
    GROW_BELOW,
    TARGET_SHARE,
    ClassLimits,
    SlotControl,
    plan_classes,
    slot_s,
)
from deployments.core.batching.batch_tuner import BatchTuner
from deployments.core.batching.cost_model import CostFit
from tests.fakes import Clock

# 5 ms per call plus 0.1 ms per padded token: 64 rows of 16 tokens take ~107 ms.
COST = CostFit(intercept_s=0.005, per_row_s=0.0, per_token_s=0.0001, samples=64)

LIMITS = {
    "realtime": ClassLimits(8, 1024, 0.002, target_s=0.06),
    "normal": ClassLimits(32, 8192, 0.01, target_s=None),
    "batch": ClassLimits(64, 16384, 0.05, target_s=None),
}
BUSY = {"realtime": 1000.0, "normal": 500.0, "batch": 2000.0}


def test_without_a_fit_the_ceilings_hold() -> None:
    plans = plan_classes(LIMITS, BUSY, fit=None, tokens_per_row=16)
    assert [p.max_batch_tokens for p in plans.values()] == [1024, 8192, 16384]
    assert [p.wait_s for p in plans.values()] == [0.002, 0.01, 0.05]


def test_a_quiet_class_does_not_wait_for_company() -> None:
    # One request every 50 ms: a 10 ms window expects 0.2 more, so it waits for none.
    plans = plan_classes(LIMITS, {"normal": 20.0}, fit=None, tokens_per_row=16)
    assert plans["normal"].wait_s == 0.0
    assert "idle" in plans["normal"].why
    assert plans["batch"].wait_s == 0.0  # no arrivals at all


def test_a_busy_class_keeps_its_window() -> None:
    plans = plan_classes(LIMITS, {"normal": 500.0}, fit=None, tokens_per_row=16)
    assert plans["normal"].wait_s == 0.01


def test_the_tightest_target_bounds_every_class_pass() -> None:
    plans = plan_classes(LIMITS, BUSY, fit=COST, tokens_per_row=16)
    slot = slot_s(LIMITS["realtime"])
    assert slot is not None and abs(slot - (0.06 * TARGET_SHARE - 0.002) / 2) < 1e-12
    for name, plan in plans.items():
        assert COST.predict_s(plan.max_batch_tokens // 16, plan.max_batch_tokens) <= slot + 1e-9
        assert plan.max_batch_tokens <= LIMITS[name].max_batch_tokens
        assert plan.max_batch_size == LIMITS[name].max_batch_size  # a ceiling, kept
    # What fits in the slot after the 5 ms overhead, at 0.1 ms a token.
    assert plans["batch"].max_batch_tokens == int((slot - 0.005) / 0.0001 + 1e-6)


def test_no_target_no_bound() -> None:
    untargeted = {**LIMITS, "realtime": ClassLimits(8, 1024, 0.002, target_s=None)}
    plans = plan_classes(untargeted, BUSY, fit=COST, tokens_per_row=16)
    assert [p.max_batch_tokens for p in plans.values()] == [1024, 8192, 16384]


def test_a_target_tighter_than_one_call_keeps_room_for_some_rows() -> None:
    # The slot never drops below twice the per-call overhead: (10 ms - 5 ms) / 0.1 ms.
    tight = {**LIMITS, "realtime": ClassLimits(8, 1024, 0.002, target_s=0.005)}
    plans = plan_classes(tight, BUSY, fit=COST, tokens_per_row=16)
    assert all(p.max_batch_tokens == 50 for p in plans.values())


def test_without_an_overhead_a_slot_too_short_still_lets_one_row_through() -> None:
    no_overhead = CostFit(intercept_s=0.0, per_row_s=0.0, per_token_s=0.01, samples=64)
    tight = {**LIMITS, "realtime": ClassLimits(8, 1024, 0.002, target_s=0.005)}
    plans = plan_classes(tight, BUSY, fit=no_overhead, tokens_per_row=16)
    assert all(p.max_batch_tokens == 16 for p in plans.values())


def test_the_tuner_learns_the_cost_then_bounds_the_batch_class() -> None:
    clock = Clock()
    tuner = BatchTuner(list(LIMITS), clock=clock)
    tuner.configure(LIMITS, adaptive=True)
    assert tuner.plans()["batch"].max_batch_tokens == 16384  # nothing measured yet
    for rows in range(1, 33):
        tuner.ran("batch", rows, rows * 16, COST.predict_s(rows, rows * 16))
    for _ in range(50):
        clock.now += 0.001
        tuner.arrived("batch", 2)
    plans = tuner.plans()
    slot = slot_s(LIMITS["realtime"])
    assert slot is not None
    assert plans["batch"].max_batch_tokens == int((slot - 0.005) / 0.0001 + 1e-6)
    assert plans["batch"].wait_s == 0.05
    report = tuner.report()
    assert report["cost_model"] is not None
    assert report["tokens_per_row"] == 16.0


def test_a_tuner_that_is_not_adaptive_returns_the_numbers_as_configured() -> None:
    tuner = BatchTuner(list(LIMITS))
    tuner.configure(LIMITS, adaptive=False)
    for rows in range(1, 33):
        tuner.ran("batch", rows, rows * 16, COST.predict_s(rows, rows * 16))
    plans = tuner.plans()
    assert [p.max_batch_tokens for p in plans.values()] == [1024, 8192, 16384]
    assert [p.wait_s for p in plans.values()] == [0.002, 0.01, 0.05]


def test_the_slot_shrinks_when_the_class_runs_late_and_grows_back_when_comfortable() -> None:
    control = SlotControl(LIMITS["realtime"])  # target 60 ms, wait 2 ms
    start = control.slot_s
    assert abs(start - (0.06 * TARGET_SHARE - 0.002) / 2) < 1e-12
    for _ in range(SlotControl.EVERY):
        control.observe(0.06 * TARGET_SHARE + 0.005)  # past the target's share
    assert abs(control.slot_s - start * 0.8) < 1e-12
    quiet = SlotControl(LIMITS["realtime"])
    for _ in range(SlotControl.WINDOW * 20):
        quiet.observe(0.01)  # well under the target, but no pass filled the slot
    assert quiet.slot_s == start
    for _ in range(SlotControl.WINDOW * 20):
        control.note_binding()
        control.observe(0.01)  # comfortable while passes fill the budget: grow
    assert control.slot_s == control.ceiling_s  # grown back, capped at the share
    control.observe(0.07)  # one item past the target shrinks the slot at once
    assert abs(control.slot_s - control.ceiling_s * 0.8) < 1e-12
    for _ in range(100):
        control.observe(0.07)  # misses shorter passes cannot cure stop at a floor
    assert control.slot_s == control.ceiling_s / 8


def test_only_misses_the_slot_could_cure_shrink_it() -> None:
    """Late items that waited at the replica no longer than planned were late elsewhere:
    the slot holds. Late items that waited behind passes longer than that shrink it."""
    control = SlotControl(LIMITS["realtime"])  # target 60 ms, wait 2 ms
    start = control.slot_s
    planned = start + 0.002
    for _ in range(SlotControl.WINDOW):
        control.observe(0.5, replica_wait_s=planned)  # seconds late, not for our passes
    assert control.slot_s == start
    assert control.report()["recent_p99_ms"] == 500.0  # still reported as it was
    control.observe(0.5, replica_wait_s=planned + 0.01)
    assert abs(control.slot_s - start * 0.8) < 1e-12


def test_the_tuner_uses_the_live_slot() -> None:
    tuner = BatchTuner(list(LIMITS))
    tuner.configure(LIMITS, adaptive=True)
    for rows in range(1, 33):
        tuner.ran("batch", rows, rows * 16, COST.predict_s(rows, rows * 16))
    for _ in range(4):
        tuner.arrived("batch", 200)
    before = tuner.plans()["batch"].max_batch_tokens
    tuner.waited("realtime", [(0.0, 0.059, 0.05)] * SlotControl.EVERY)
    after = tuner.plans()["batch"].max_batch_tokens
    assert after < before
    assert tuner.report()["targets"]["realtime"]["recent_p99_ms"] == 59.0


def test_a_lone_client_never_waits_however_fast_it_sends() -> None:
    clock = Clock()
    tuner = BatchTuner(list(LIMITS), clock=clock)
    tuner.configure(LIMITS, adaptive=True)
    # 400 requests/s from one closed-loop client: each arrives with nothing else of its
    # class at the replica, so no wait could have brought it company.
    for _ in range(400):
        clock.now += 0.0025
        tuner.arrived("normal", 1, company=False)
    assert tuner.plans()["normal"].wait_s == 0.0
    assert tuner.plans()["normal"].why.startswith("idle")
    # The same rate from clients that overlap: waiting fills batches, so the window holds.
    for _ in range(400):
        clock.now += 0.0025
        tuner.arrived("normal", 1, company=True)
    assert tuner.plans()["normal"].wait_s == LIMITS["normal"].wait_s


def test_items_that_arrived_before_the_slot_moved_do_not_move_it_again() -> None:
    clock = Clock()
    control = SlotControl(LIMITS["realtime"], clock)  # target 60 ms
    start = control.slot_s
    clock.now = 1.0
    control.observe(0.07, arrived_s=0.9)  # a miss: shrink at once
    assert abs(control.slot_s - start * 0.8) < 1e-12
    # A stall caught twenty more in the queue: they were planned under the old slot.
    for _ in range(20):
        control.observe(0.07, arrived_s=0.95)
    assert abs(control.slot_s - start * 0.8) < 1e-12
    # One that arrived after the move and still misses is news.
    clock.now = 1.2
    control.observe(0.07, arrived_s=1.1)
    assert abs(control.slot_s - start * 0.64) < 1e-12


def test_a_slot_far_under_its_target_grows_faster() -> None:
    clock = Clock()
    far = SlotControl(LIMITS["realtime"], clock)
    near = SlotControl(LIMITS["realtime"], clock)
    start = far.slot_s
    for _ in range(SlotControl.EVERY):
        far.note_binding()
        near.note_binding()
        far.observe(0.06 * GROW_BELOW / 4)  # far under the growth bar
        near.observe(0.06 * GROW_BELOW * 0.8)  # under the bar, not far under
    assert abs(far.slot_s - start * 1.25) < 1e-12
    assert abs(near.slot_s - start * 1.1) < 1e-12


def test_the_tuner_ignores_latencies_until_the_cost_model_has_a_fit() -> None:
    tuner = BatchTuner(list(LIMITS))
    tuner.configure(LIMITS, adaptive=True)
    # A replica's first passes are slow (kernels built for new shapes): no slot to blame.
    tuner.waited("realtime", [(0.0, 0.5, 0.4)] * SlotControl.EVERY)
    assert tuner.report()["targets"]["realtime"]["recent_p99_ms"] == 0.0
    for rows in range(1, 33):
        tuner.ran("realtime", rows, rows * 16, COST.predict_s(rows, rows * 16))
    tuner.waited("realtime", [(0.0, 0.5, 0.4)])
    assert tuner.report()["targets"]["realtime"]["recent_p99_ms"] == 500.0


def test_the_tuner_reports_its_capacity_in_full_passes() -> None:
    tuner = BatchTuner(list(LIMITS))
    tuner.configure(LIMITS, adaptive=True)
    assert tuner.full_pass_rows_per_s() is None  # no fit yet
    for rows in range(1, 33):
        tuner.ran("batch", rows, rows * 16, COST.predict_s(rows, rows * 16))
    # the largest class's pass: 64 rows of 16 tokens, 5 + 102.4 ms
    assert tuner.full_pass_rows_per_s() == pytest.approx(64 / 0.1074)
    assert tuner.full_pass_rows_per_s(passes=2) == pytest.approx(2 * 64 / 0.1074)


def test_a_class_runs_full_passes_only_while_every_class_above_is_quiet() -> None:
    clock = Clock()
    limits = {
        **LIMITS,
        "batch": ClassLimits(64, 128, 0.05, target_s=None, alone_max_batch_tokens=16384),
    }
    tuner = BatchTuner(list(limits), clock=clock)
    tuner.configure(limits, adaptive=False)
    # nothing above has ever arrived: the batch class runs alone
    assert tuner.plans()["batch"].max_batch_tokens == 16384
    tuner.arrived("realtime", 1, company=False)  # a lone client counts too
    plan = tuner.plans()["batch"]
    assert plan.max_batch_tokens == 128 and "alone" not in plan.why
    clock.now += 1.0
    tuner.arrived("batch", 64)  # its own arrivals do not matter
    assert tuner.plans()["batch"].max_batch_tokens == 128
    clock.now += 1.0  # two seconds without realtime or normal
    assert tuner.plans()["batch"].max_batch_tokens == 16384
    tuner.arrived("normal", 8)
    assert tuner.plans()["batch"].max_batch_tokens == 128
    assert tuner.plans()["normal"].max_batch_tokens == 8192  # it has no alone budget


def test_a_full_pass_alone_is_bounded_in_time_and_waits_for_a_fit() -> None:
    limits = {
        **LIMITS,
        "batch": ClassLimits(
            64, 128, 0.05, target_s=None, alone_max_batch_tokens=16384, alone_max_pass_s=0.1
        ),
    }
    tuner = BatchTuner(list(limits))
    tuner.configure(limits, adaptive=False)
    # no fit: how long a full pass takes is unknown, so the passes stay short
    assert tuner.plans()["batch"].max_batch_tokens == 128
    for rows in range(1, 33):
        tuner.ran("batch", rows, rows * 16, COST.predict_s(rows, rows * 16))
    # 5 ms + 0.1 ms a token: 950 tokens end within 100 ms, far under the 16384 ceiling
    plan = tuner.plans()["batch"]
    assert plan.max_batch_tokens == 950 and "alone" in plan.why
    # the capacity counts the pass the time bound allows: 59 rows of 16 tokens
    assert tuner.full_pass_rows_per_s() == pytest.approx(59 / COST.predict_s(59, 59 * 16))


def test_a_class_matches_the_passes_the_classes_above_are_running() -> None:
    clock = Clock()
    limits = {
        **LIMITS,
        "batch": ClassLimits(
            64, 128, 0.05, target_s=None, alone_max_batch_tokens=16384, alone_max_pass_s=0.1
        ),
    }
    tuner = BatchTuner(list(limits), clock=clock)
    tuner.configure(limits, adaptive=False)
    tuner.arrived("normal", 8)  # normal is busy: no passes alone
    # no fit yet: how long a matching pass takes is unknown, so the passes stay short
    tuner.ran("normal", 20, 400, 0.045)
    assert tuner.plans()["batch"].max_batch_tokens == 128
    for rows in range(1, 33):
        tuner.ran("batch", rows, rows * 16, COST.predict_s(rows, rows * 16))
    clock.now += 1.5  # those passes are past: only what normal runs next counts
    tuner.ran("normal", 20, 400, COST.predict_s(20, 400))
    tuner.ran("normal", 30, 600, COST.predict_s(30, 600))
    plan = tuner.plans()["batch"]
    assert plan.max_batch_tokens == 500 and "in company" in plan.why  # their mean
    tuner.ran("normal", 64, 4096, COST.predict_s(64, 4096))
    # never past the time bound of a pass alone: 950 tokens within 100 ms
    assert tuner.plans()["batch"].max_batch_tokens == 950
    clock.now += 1.1
    tuner.arrived("normal", 8)  # normal is still there but ran nothing for a second
    assert tuner.plans()["batch"].max_batch_tokens == 128
    assert tuner.plans()["normal"].max_batch_tokens == 8192  # a class above is untouched
