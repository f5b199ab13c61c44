"""Memory faults lose nothing: a fake forward pass that runs out of memory above a token
budget; batches split, the poison input fails alone, the budget halves and climbs back."""

from __future__ import annotations

import pytest
import torch

from deployments.core.batching.batch_policy import ClassLimits
from deployments.core.batching.batch_tuner import BatchTuner
from deployments.core.memory.split_retry import TooLargeForMemory, run_split
from deployments.core.memory.token_backoff import TokenBackoff
from deployments.core.protocol import Rejection
from deployments.replicas.batched.batched_jobs import failed_outcome
from deployments.replicas.memory import is_memory_fault


class OutOfMemory(RuntimeError):
    pass


def forward_with_room(room_tokens: int, calls: list[list[int]]):
    """Items are token counts; a pass costs rows x longest, like a padded batch."""

    def forward(items: list[int]) -> list[str]:
        calls.append(list(items))
        if len(items) * max(items) > room_tokens:
            raise OutOfMemory("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [f"vector of {n}" for n in items]

    return forward


def fault(error: BaseException) -> bool:
    return isinstance(error, OutOfMemory)


def test_a_batch_too_big_is_split_until_every_input_is_answered_in_order() -> None:
    calls: list[list[int]] = []
    items = [10, 20, 30, 40, 50, 60, 70, 80]
    results, report = run_split(items, forward_with_room(200, calls), fault)
    assert results == [f"vector of {n}" for n in items]
    assert report.faults >= 1 and report.splits == report.faults and report.failed_alone == 0
    assert calls[0] == items  # the whole batch was tried first


def test_a_poison_input_fails_alone_and_its_batch_mates_are_answered() -> None:
    calls: list[list[int]] = []
    items = [10, 500, 20, 30]
    released: list[int] = []
    results, report = run_split(
        items, forward_with_room(200, calls), fault, after_fault=lambda: released.append(1)
    )
    assert results[0] == "vector of 10" and results[2:] == ["vector of 20", "vector of 30"]
    assert isinstance(results[1], TooLargeForMemory)
    assert report.failed_alone == 1
    assert len(released) == report.faults  # cached memory handed back after every fault


def test_another_error_is_not_retried() -> None:
    def broken(items: list[int]) -> list[str]:
        raise ValueError("a bug, not memory")

    with pytest.raises(ValueError, match="a bug"):
        run_split([1, 2, 3], broken, fault)


def test_a_forward_that_loses_results_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="2 results for 3 inputs"):
        run_split([1, 2, 3], lambda items: ["a", "b"], fault)


def test_the_budget_halves_at_once_and_climbs_back_a_step_at_a_time() -> None:
    backoff = TokenBackoff(floor=16, step=100)
    backoff.fault(padded_tokens=1000)
    assert backoff.cap == 500
    backoff.fault(padded_tokens=800)  # a second fault halves what is in force, not the pass
    assert backoff.cap == 250
    for _ in range(3):
        backoff.success(ceiling=1024)
    assert backoff.cap == 550
    for _ in range(5):
        backoff.success(ceiling=1024)
    assert backoff.cap is None  # back at the ceiling: the cap is out of the way
    backoff.fault(padded_tokens=20)
    assert backoff.cap == 16  # never below the floor


def test_the_tuner_caps_every_class_after_a_fault() -> None:
    tuner = BatchTuner(["realtime", "batch"])
    tuner.configure(
        {
            "realtime": ClassLimits(8, 1024, 0.002, None),
            "batch": ClassLimits(64, 16384, 0.05, None),
        },
        adaptive=False,
    )
    tuner.memory_fault(padded_tokens=4096)
    plans = tuner.plans()
    assert plans["batch"].max_batch_tokens == 2048 and "memory backoff" in plans["batch"].why
    assert plans["realtime"].max_batch_tokens == 1024  # already under the cap
    for _ in range(300):
        tuner.ran("batch", 8, 64, 0.01)
    assert tuner.plans()["batch"].max_batch_tokens == 16384


def test_an_input_too_large_for_memory_is_a_413_naming_the_reason() -> None:
    outcome = failed_outcome(["ok", TooLargeForMemory("does not fit")], "embed")
    assert isinstance(outcome, Rejection)
    assert (outcome.status, outcome.code) == (413, "input_too_large_for_memory")


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"),
        MemoryError(),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"
        ),
        RuntimeError("bad allocation"),
    ],
)
def test_memory_faults_are_recognised(error: BaseException) -> None:
    assert is_memory_fault(error)


@pytest.mark.parametrize("error", [RuntimeError("shape mismatch"), ValueError("out of memory")])
def test_other_errors_are_not_memory_faults(error: BaseException) -> None:
    assert not is_memory_fault(error)
