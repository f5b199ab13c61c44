"""The share HAProxy is told to refuse, driven by a simulated front: offered load arrives,
HAProxy refuses its share at random, admission takes what it can serve."""

from __future__ import annotations

import random

import pytest

from deployments.core.admission.front_shedding import CEILING, STALE_S, FrontShedding

KEY = "embed_normal"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(
    shedding: FrontShedding, clock: Clock, offered_per_s: int, capacity_per_s: int, seconds: int
) -> tuple[int, int]:
    """Seconds of load through a simulated HAProxy; returns (reached, admitted) in the
    last second. Admission serves up to `capacity_per_s` a second and refuses the rest."""
    rng = random.Random(7)
    reached = admitted = 0
    for _ in range(seconds):
        reached = admitted = 0
        for i in range(offered_per_s):
            clock.now += 1 / offered_per_s
            permille = shedding.advice(KEY).permille
            if rng.random() * 1000 < permille:
                continue  # HAProxy's refusal: the ingress never hears of it
            reached += 1
            ok = admitted < capacity_per_s * (i + 1) / offered_per_s + 1
            admitted += ok
            shedding.observe(KEY, permille, None if ok else 2)
    return reached, admitted


def test_at_twice_capacity_the_front_refuses_the_excess_and_admission_sees_headroom() -> None:
    clock = Clock()
    shedding = FrontShedding(headroom=1.25, clock=clock)
    reached, admitted = run(shedding, clock, offered_per_s=300, capacity_per_s=150, seconds=20)
    assert admitted == pytest.approx(150, rel=0.05)
    assert reached == pytest.approx(1.25 * 150, rel=0.15)
    assert shedding.advice(KEY).permille == pytest.approx(375, abs=60)
    assert shedding.advice(KEY).retry_after_s == 2


def test_when_the_load_falls_the_share_falls_to_nothing() -> None:
    clock = Clock()
    shedding = FrontShedding(clock=clock)
    run(shedding, clock, offered_per_s=400, capacity_per_s=100, seconds=10)
    assert shedding.advice(KEY).permille > 500
    reached, admitted = run(shedding, clock, offered_per_s=80, capacity_per_s=100, seconds=15)
    assert shedding.advice(KEY).permille < 10
    assert admitted == reached >= 76  # the last of the share fades within that second


def test_a_share_falls_fast_when_clients_back_off() -> None:
    clock = Clock()
    shedding = FrontShedding(clock=clock)
    run(shedding, clock, offered_per_s=400, capacity_per_s=100, seconds=10)
    high = shedding.advice(KEY).permille
    # The clients back off (they honour Retry-After): half the offered load, all of it
    # within capacity once the share lets it through.
    run(shedding, clock, offered_per_s=100, capacity_per_s=100, seconds=3)
    assert shedding.advice(KEY).permille < high / 3  # halved at each window's close


def test_a_second_in_which_admission_refused_nothing_keeps_a_steady_floods_share() -> None:
    """At twice capacity a second can come in which admission takes all that reached it
    (the model ran a little faster, fewer came): the flood behind the share is the same,
    and halving the share would send the ingress several times the requests it can judge."""
    clock = Clock()
    shedding = FrontShedding(headroom=1.25, clock=clock)
    run(shedding, clock, offered_per_s=400, capacity_per_s=100, seconds=10)
    high = shedding.advice(KEY).permille
    assert high == pytest.approx(1000 * (1 - 1.25 * 100 / 400), abs=60)
    run(shedding, clock, offered_per_s=400, capacity_per_s=400, seconds=1)  # took them all
    # That window closes with the next second's first arrival.
    run(shedding, clock, offered_per_s=400, capacity_per_s=100, seconds=1)
    assert shedding.advice(KEY).permille >= 0.85 * high  # halved, as first built: 0.51
    run(shedding, clock, offered_per_s=400, capacity_per_s=100, seconds=3)
    assert shedding.advice(KEY).permille == pytest.approx(high, abs=60)


def test_nothing_is_shed_below_capacity_and_keys_are_apart() -> None:
    clock = Clock()
    shedding = FrontShedding(clock=clock)
    run(shedding, clock, offered_per_s=100, capacity_per_s=150, seconds=10)
    assert shedding.advice(KEY).permille == 0
    assert shedding.advice("rerank_batch").permille == 0
    assert shedding.shares() == {KEY: 0.0}


def test_a_model_that_admits_nothing_is_shed_at_the_ceiling_but_never_wholly() -> None:
    clock = Clock()
    shedding = FrontShedding(clock=clock)
    run(shedding, clock, offered_per_s=100, capacity_per_s=0, seconds=30)
    assert shedding.advice(KEY).permille == pytest.approx(CEILING * 1000, abs=5)


def test_a_sparse_key_waits_for_enough_arrivals_or_four_windows() -> None:
    clock = Clock()
    shedding = FrontShedding(clock=clock)
    for _ in range(5):
        clock.now += 0.5
        shedding.observe(KEY, 0, 1)
    assert shedding.advice(KEY).permille == 0  # 2.5 s, 5 arrivals: still one window
    clock.now += 2
    shedding.observe(KEY, 0, 1)
    assert shedding.advice(KEY).permille > 0


def test_headroom_must_leave_admission_some_excess() -> None:
    with pytest.raises(ValueError):
        FrontShedding(headroom=1.0)


def test_a_key_that_went_quiet_starts_again_from_nothing() -> None:
    """HAProxy forgets a share after a few quiet seconds; so does the ingress, or the first
    answers to clients coming back to an idle model would ask it to refuse them."""
    clock = Clock()
    shedding = FrontShedding(clock=clock)
    run(shedding, clock, offered_per_s=400, capacity_per_s=100, seconds=10)
    assert shedding.advice(KEY).permille > 500
    clock.now += STALE_S + 1
    assert shedding.shares() == {KEY: 0.0}
    assert shedding.observe(KEY, 0, None).permille == 0
