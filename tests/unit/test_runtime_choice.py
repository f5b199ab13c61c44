"""`runtime: auto`'s choice (pure logic), with fake backends and a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.backends.runtimes.choice import choose, min_cosine, score_correlation

REF = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


class FakeClock:
    """Each forward advances the clock by its backend's cost per text."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_build(costs: dict[str, float], outputs: dict[str, np.ndarray], clock: FakeClock):
    def build(name: str):
        if name not in costs:
            raise RuntimeError(f"{name} is not installed\nsecond line")

        def forward(batch: int) -> np.ndarray:
            clock.now += costs[name] * batch
            return outputs.get(name, REF)

        return forward

    return build


def test_keeps_the_fastest_agreeing_candidate_and_says_why() -> None:
    clock = FakeClock()
    costs = {"torch-fp32": 3.0, "torch-bf16": 2.0, "openvino": 1.0, "onnx-int8": 0.5}
    off = REF + np.array([[0.0, 0.2, 0.0], [0.0, 0.0, 0.0]])  # cosine ~0.98: too far
    choice = choose(
        ["torch-fp32", "torch-bf16", "openvino", "onnx-int8", "onnx"],
        fake_build(costs, {"onnx-int8": off}, clock),
        probe=2,
        batches={1: 1, 32: 32},
        agreement=min_cosine,
        min_agreement=0.999,
        clock=clock,
    )
    assert choice.runtime == "openvino"
    assert choice.forward(1) is REF
    trials = {t.runtime: t for t in choice.trials}
    assert trials["openvino"].texts_per_s == {1: 1.0, 32: 1.0}
    assert trials["torch-fp32"].texts_per_s[32] == pytest.approx(1 / 3)
    assert "agreement 0.98" in trials["onnx-int8"].rejected
    assert trials["onnx"].rejected == "failed: RuntimeError: onnx is not installed"
    assert "2.00x torch-bf16" in choice.reason and "onnx-int8" in choice.reason
    report = choice.report()
    assert report["runtime"] == "openvino"
    assert report["candidates"][0]["texts_per_s"] == {"1": 0.3, "32": 0.3}


def test_the_reference_wins_when_nothing_else_agrees_or_runs() -> None:
    clock = FakeClock()
    choice = choose(
        ["torch-bf16"],
        fake_build({"torch-fp32": 1.0, "torch-bf16": 0.1}, {"torch-bf16": -REF}, clock),
        probe=2,
        batches={8: 8},
        agreement=min_cosine,
        min_agreement=0.999,
        clock=clock,
    )
    assert choice.runtime == "torch-fp32"
    assert "rejected torch-bf16: agreement -1" in choice.reason


def test_a_candidate_failing_while_timed_is_dropped() -> None:
    clock = FakeClock()
    calls = {"n": 0}

    def build(name: str):
        def forward(batch: int) -> np.ndarray:
            if name == "onnx":
                calls["n"] += 1
                if calls["n"] > 2:  # the probe, the untimed warm-up, then a timed call
                    raise MemoryError("out of memory")
            clock.now += 1.0 if name == "torch-fp32" else 0.1
            return REF

        return forward

    choice = choose(["onnx"], build, 2, {4: 4}, min_cosine, 0.999, clock=clock)
    assert choice.runtime == "torch-fp32"
    assert "MemoryError" in next(t for t in choice.trials if t.runtime == "onnx").rejected


def test_agreement_measures() -> None:
    assert min_cosine(REF * 3, REF) == pytest.approx(1.0)
    assert min_cosine(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]), REF) == pytest.approx(2**-0.5)
    scores = np.array([0.1, 2.0, -1.0, 0.5])
    assert score_correlation(scores + 0.001, scores) == pytest.approx(1.0)
    assert score_correlation(scores[::-1].copy(), scores) < 0.5
    assert score_correlation(np.ones(3), np.ones(3)) == 1.0
    assert score_correlation(np.ones(4), scores) == 0.0
