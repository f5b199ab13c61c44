"""TargetAim: how much of a class's target admission aims at, from the misses of each second."""

import pytest

from deployments.core.admission.target_aim import AIM_FLOOR, AIM_STEP, MIN_ANSWERS, TargetAim
from tests.fakes import Clock

TARGET = 0.5


def second(aim: TargetAim, clock: Clock, answers: int, missed: int) -> None:
    """One window of `answers` answers, `missed` of them past the target; then the clock
    moves on to the next window."""
    for i in range(answers):
        aim.answered(TARGET * (2 if i < missed else 0.5), TARGET)
    clock.now += 1.0


def test_a_second_that_misses_more_than_one_in_a_hundred_cuts_the_aim() -> None:
    clock = Clock()
    aim = TargetAim(clock=clock)
    assert aim.aim == 1.0
    second(aim, clock, answers=100, missed=6)
    # 6 % missed: 5 % over the allowed 1 %, cut by 2 x 5 % = 10 %
    assert aim.aim == pytest.approx(0.9)
    assert aim.report() == {"aim": 0.9, "missed_share": 0.06, "cuts": 1}


def test_a_tail_that_keeps_missing_is_cut_fast_but_never_below_the_floor() -> None:
    clock = Clock()
    aim = TargetAim(clock=clock)
    second(aim, clock, answers=100, missed=100)
    assert aim.aim == pytest.approx(0.7)  # one cut is at most 30 %
    for _ in range(10):
        second(aim, clock, answers=100, missed=100)
    assert aim.aim == pytest.approx(AIM_FLOOR)


def test_calm_seconds_give_the_aim_back_a_step_at_a_time() -> None:
    clock = Clock()
    aim = TargetAim(clock=clock)
    second(aim, clock, answers=100, missed=100)
    second(aim, clock, answers=100, missed=0)
    assert aim.aim == pytest.approx(0.7 + AIM_STEP)
    for _ in range(50):
        second(aim, clock, answers=100, missed=0)
    assert aim.aim == 1.0


def test_misses_near_the_allowed_share_hold_the_aim() -> None:
    clock = Clock()
    aim = TargetAim(clock=clock)
    second(aim, clock, answers=100, missed=100)
    second(aim, clock, answers=200, missed=2)  # 1 %: neither over it nor under half of it
    assert aim.aim == pytest.approx(0.7)


def test_a_trickle_is_too_little_to_cut_the_aim() -> None:
    clock = Clock()
    aim = TargetAim(clock=clock)
    second(aim, clock, answers=MIN_ANSWERS - 1, missed=MIN_ANSWERS - 1)
    assert aim.aim == 1.0 and aim.report()["missed_share"] is None


def test_a_quiet_spell_after_a_flood_gives_the_aim_back() -> None:
    clock = Clock()
    aim = TargetAim(clock=clock)
    for _ in range(5):
        second(aim, clock, answers=100, missed=100)
    assert aim.aim == pytest.approx(AIM_FLOOR)
    second(aim, clock, answers=3, missed=1)  # a late answer in a trickle: held
    assert aim.aim == pytest.approx(AIM_FLOOR)
    clock.now += 9.0  # nine seconds without a late answer
    assert aim.aim == pytest.approx(AIM_FLOOR + 9 * AIM_STEP)
    clock.now += 60.0
    assert aim.aim == 1.0
