"""Where a job's time went: its replica's record (batched_jobs.JobState), carried on its
outcome by run_jobs, and the headers the ingress answers with (api/timing_headers.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.protocol import JobTiming
from deployments.ingress.api.timing_headers import timing_headers
from deployments.replicas.batched.batched_jobs import JobState, run_jobs


def test_the_queue_runs_from_the_ingress_arrival_to_the_first_pass() -> None:
    state = JobState("r", None, arrived=10.0, began=9.5)
    state.ran_pass(10.25, 0.5)
    state.ran_pass(11.0, 0.25)  # a second pass for the rest of its inputs
    assert state.timing() == JobTiming(tokenize_s=0.0, queue_s=0.75, inference_s=0.75)


def test_a_job_no_pass_computed_has_no_queue_or_inference() -> None:
    assert JobState("r", None).timing() == JobTiming(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Item:
    state: JobState
    budget: BatchBudget = field(default_factory=lambda: BatchBudget(8, 64))
    tokens: int = 1


@dataclass(frozen=True)
class Plan:
    items: list[Item]


@dataclass(frozen=True)
class Outcome:
    values: list[str]
    timing: JobTiming | None = field(default=None)


class SlowTokenizer:
    """Plans each job's texts as items, taking 10 ms per text to do it."""

    what = "test"

    def plan(self, jobs, states, budget):
        time.sleep(0.01 * sum(len(job) for job in jobs))
        return [Plan([Item(state) for _ in job]) for job, state in zip(jobs, states, strict=True)]

    def compute(self, items):
        return ["x" for _ in items]

    def collect(self, plan, results):
        return Outcome(results)


async def test_every_outcome_carries_its_job_timing_and_share_of_the_tokenising() -> None:
    async def run_item(item: Item) -> str:
        item.state.ran_pass(time.monotonic(), 0.002)
        return "x"

    states = [JobState("a", None), JobState("b", None)]
    first, second = await run_jobs(
        SlowTokenizer(), [["t"] * 3, ["t"]], states, BatchBudget(8, 64), run_item
    )
    assert isinstance(first, Outcome) and isinstance(second, Outcome)
    assert first.timing is not None and second.timing is not None
    # Three texts of four: three quarters of the call's ~40 ms of tokenising.
    assert first.timing.tokenize_s >= 0.029 and second.timing.tokenize_s >= 0.0095
    assert abs(first.timing.tokenize_s - 3 * second.timing.tokenize_s) < 1e-9
    # Each of the first job's three items ran in a pass of its own here.
    assert first.timing.inference_s == pytest.approx(0.006)
    assert second.timing.inference_s == pytest.approx(0.002)
    # Planned before any pass: the queue includes the tokenising.
    assert first.timing.queue_s >= 0.039


def test_headers_give_whole_milliseconds_as_tei_does_and_server_timing_finer() -> None:
    headers = timing_headers(0.0427, JobTiming(0.0011, 0.0213, 0.0150))
    assert headers["x-total-time"] == "42"
    assert headers["x-tokenization-time"] == "1"
    assert headers["x-queue-time"] == "21"
    assert headers["x-inference-time"] == "15"
    assert headers["Server-Timing"] == (
        "total;dur=42.70, tokenization;dur=1.10, queue;dur=21.30, inference;dur=15.00"
    )


def test_an_answer_no_replica_computed_has_only_its_total() -> None:
    headers = timing_headers(0.003, None)
    assert headers == {"x-total-time": "3", "Server-Timing": "total;dur=3.00"}
