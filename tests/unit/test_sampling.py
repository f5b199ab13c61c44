"""Sampling over every value the API admits: tiny and huge temperatures, degenerate top-p,
seeds outside torch's range, and logits that are not all finite. Nothing may raise: this
runs on the engine's thread, where one exception used to stop generation for everyone."""

from __future__ import annotations

import math

import pytest
import torch

from deployments.backends.generation.sampling import (
    RowSampler,
    SamplingParams,
    draw_token,
    sample_rows,
)

VOCAB = 50
TINY_TEMPERATURES = [5e-324, 1e-300, 1e-46, 1e-39, 1.2e-38, 1e-20, 1e-7]


def logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 8


def draw(row: torch.Tensor, params: SamplingParams) -> int:
    return draw_token(row, params, params.generator())


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_a_temperature_near_zero_is_greedy(temperature: float) -> None:
    for seed in range(5):
        row = logits(seed)
        assert draw(row, SamplingParams(temperature, seed=seed)) == int(row.argmax())


@pytest.mark.parametrize("top_p", [5e-324, 1e-300, 1e-46, 1e-39, 1e-9])
def test_a_top_p_near_zero_keeps_the_most_likely_token(top_p: float) -> None:
    for seed in range(5):
        row = logits(seed)
        params = SamplingParams(1.0, top_p, seed=seed)
        assert draw(row, params) == int(row.argmax())


@pytest.mark.parametrize("temperature", [2.0, 1.0, 0.5])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 1e-300])
def test_ordinary_values_draw_a_valid_token_repeatably(temperature: float, top_p: float) -> None:
    row = logits(3)
    params = SamplingParams(temperature, top_p, seed=11)
    first = [draw_token(row, params, g) for g in [params.generator()] for _ in range(20)]
    again = [draw_token(row, params, g) for g in [params.generator()] for _ in range(20)]
    assert first == again and all(0 <= t < VOCAB for t in first)


def test_top_p_keeps_only_the_nucleus() -> None:
    row = torch.full((VOCAB,), -10.0)
    row[7], row[9] = 5.0, 4.9  # ~0.52 / ~0.47 of the mass; the rest ~1e-6
    params = SamplingParams(1.0, 0.9, seed=0)
    generator = params.generator()
    drawn = {draw_token(row, params, generator) for _ in range(200)}
    assert drawn == {7, 9}


@pytest.mark.parametrize("seed", [0, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**200, -1, -(2**70)])
def test_any_integer_is_a_seed(seed: int) -> None:
    params = SamplingParams(1.0, seed=seed)
    assert draw(logits(), params) == draw(logits(), params)


@pytest.mark.parametrize("temperature", [1e-39, 0.7, 2.0])
def test_logits_that_are_not_all_finite_fall_back_to_the_argmax(temperature: float) -> None:
    params = SamplingParams(temperature, 0.95, seed=1)
    plus_inf = logits()
    plus_inf[4] = math.inf
    assert draw(plus_inf, params) == 4
    all_minus_inf = torch.full((VOCAB,), -math.inf)
    assert 0 <= draw(all_minus_inf, params) < VOCAB
    with_nan = logits()
    with_nan[2] = math.nan
    expected = int(torch.nan_to_num(with_nan, nan=-math.inf).argmax())
    assert draw(with_nan, params) == expected
    all_nan = torch.full((VOCAB,), math.nan)
    assert 0 <= draw(all_nan, params) < VOCAB
    some_minus_inf = logits()
    some_minus_inf[:10] = -math.inf
    assert draw(some_minus_inf, params) >= 10


def test_a_nan_temperature_or_top_p_does_not_raise() -> None:
    row = logits()
    assert draw(row, SamplingParams(math.nan)) == int(row.argmax())
    assert 0 <= draw(row, SamplingParams(1.0, math.nan, seed=1)) < VOCAB


def test_sample_rows_leaves_greedy_rows_and_reports_a_failing_row_alone() -> None:
    class Poison(RowSampler):
        def draw(self, logits: torch.Tensor) -> int:
            raise ValueError("poisoned")

    scores = torch.stack([logits(0), logits(1), logits(2)])
    before = scores.clone()
    rows = [
        None,
        Poison.of(SamplingParams(1.0, seed=1)),
        RowSampler.of(SamplingParams(1.0, seed=2)),
    ]
    failed = sample_rows(scores, rows)
    assert list(failed) == [1] and isinstance(failed[1], ValueError)
    assert torch.equal(scores[0], before[0]) and torch.equal(scores[1], before[1])
    assert torch.isfinite(scores[2]).sum() == 1 and scores[2].max() == 0.0
