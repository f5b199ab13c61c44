"""The online cost fit: recovers a known cost, never goes negative, and follows change."""

from __future__ import annotations

import random

import pytest

from deployments.core.batching.arrival_rate import ArrivalRate
from deployments.core.batching.cost_model import MIN_SAMPLES, CostFit, CostModel, fit
from tests.fakes import Clock


def test_a_linear_cost_is_recovered_from_noisy_passes() -> None:
    rng = random.Random(7)
    model = CostModel()
    for _ in range(200):
        rows = rng.randint(1, 64)
        tokens = rows * rng.randint(8, 64)
        model.observe(rows, tokens, 0.004 + 0.0002 * rows + 0.00001 * tokens + rng.gauss(0, 2e-4))
    got = model.current
    assert got is not None
    assert got.intercept_s == pytest.approx(0.004, abs=3e-4)
    assert got.per_row_s == pytest.approx(0.0002, abs=5e-5)
    assert got.per_token_s == pytest.approx(0.00001, abs=2e-6)


def test_no_fit_before_enough_passes() -> None:
    model = CostModel()
    for _ in range(MIN_SAMPLES - 1):
        model.observe(4, 40, 0.01)
    assert model.current is None


def test_passes_of_one_size_still_give_a_usable_fit() -> None:
    got = fit([(8, 80, 0.02)] * 16)
    assert got is not None
    assert got.predict_s(8, 80) == pytest.approx(0.02)


def test_rows_proportional_to_tokens_fold_into_one_slope() -> None:
    # Every row the same length: rows and tokens cannot be told apart, the fit keeps one.
    got = fit([(r, 10 * r, 0.002 + 0.0001 * 10 * r) for r in range(1, 20)])
    assert got is not None
    assert got.per_row_s == 0.0
    assert got.intercept_s == pytest.approx(0.002, abs=1e-9)
    assert got.per_token_s == pytest.approx(0.0001, abs=1e-9)


def test_no_coefficient_is_negative() -> None:
    # Bigger batches that ran faster (a machine that got quieter) must not teach the fit
    # that tokens save time.
    passes = [(r, 10 * r + (r % 3), 0.05 - 0.0005 * r) for r in range(1, 40)]
    got = fit(passes)
    assert got is not None
    assert min(got.intercept_s, got.per_row_s, got.per_token_s) >= 0.0


def test_the_window_forgets_old_passes() -> None:
    model = CostModel(window=32, refit_every=1)
    for r in range(1, 33):
        model.observe(r, 10 * r, 0.001 * r)
    for r in range(1, 33):
        model.observe(r, 10 * r, 0.003 * r)  # the machine got three times slower
    got = model.current
    assert got is not None
    assert got.predict_s(10, 100) == pytest.approx(0.03, rel=0.01)


def test_tokens_within_a_slot() -> None:
    cost = CostFit(intercept_s=0.005, per_row_s=0.0, per_token_s=0.0001, samples=10)
    assert cost.tokens_within(0.025, tokens_per_row=10) == 200
    assert cost.tokens_within(0.004, tokens_per_row=10) == 0  # not even the overhead fits
    with_rows = CostFit(intercept_s=0.0, per_row_s=0.001, per_token_s=0.0, samples=10)
    assert with_rows.tokens_within(0.01, tokens_per_row=20) == 200  # 10 rows of 20


def test_the_arrival_rate_follows_a_steady_stream_and_decays_when_it_stops() -> None:
    clock = Clock()
    rate = ArrivalRate(half_life_s=0.5, clock=clock)
    for _ in range(500):
        clock.now += 0.01
        rate.add(1)
    assert rate.per_s() == pytest.approx(100, rel=0.05)
    clock.now += 5.0
    assert rate.per_s() < 0.1
