"""The coalescer and cancellation: a job whose client left is never sent, and a call whose
jobs are all gone is cancelled."""

import asyncio

import pytest

from deployments.core.admission.coalescer import CallInterrupted, CoalescerStats, DeadlineExpired
from tests.unit.coalescer_support import (
    FakeModel,
    LoopClock,
    assert_drained,
    make,
    settle,
    start_busy_call,
)


async def test_a_request_cancelled_while_waiting_is_never_sent() -> None:
    model = FakeModel()
    coalescer = make(model)
    busy = await start_busy_call(coalescer, model)
    leaving = asyncio.create_task(coalescer.submit(["gone", "too"]))
    staying = asyncio.create_task(coalescer.submit(["kept"]))
    await settle()
    assert (coalescer.stats.queued_jobs, coalescer.stats.queued_items) == (2, 3)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert (coalescer.stats.queued_jobs, coalescer.stats.queued_items) == (1, 1)
    model.gate.set()
    assert await asyncio.gather(busy, staying) == ["x", "kept"]
    assert ["gone", "too"] not in model.sent
    assert coalescer.stats.abandoned == 0  # it never reached the model
    assert_drained(coalescer)


async def test_when_every_job_of_a_sent_call_is_gone_the_call_is_cancelled() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    jobs = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    await settle()
    assert coalescer.stats.in_flight == 1
    queued = asyncio.create_task(coalescer.submit(["next"]))
    await settle()
    for job in jobs:
        job.cancel()
    await settle()
    assert model.cancelled == [[["0"], ["1"], ["2"]]]
    assert coalescer.stats.cancelled_calls == 1
    assert coalescer.stats.abandoned == 3
    # The freed slot goes to the job queued behind the cancelled call.
    assert model.calls[-1] == [["next"]]
    model.gate.set()
    assert await queued == "next"
    assert all(job.cancelled() for job in jobs)
    assert_drained(coalescer)


async def test_when_some_jobs_of_a_sent_call_are_gone_on_abandon_is_told() -> None:
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, on_abandon=abandoned.append)
    model.gate.clear()
    jobs = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    await settle()
    jobs[1].cancel()
    await settle()
    assert abandoned == [["1"]]
    assert model.cancelled == []
    assert coalescer.stats.in_flight == 1
    model.gate.set()
    assert await jobs[0] == "0"
    assert await jobs[2] == "2"
    assert jobs[1].cancelled()
    stats = coalescer.stats
    assert (stats.abandoned, stats.cancelled_calls) == (1, 0)
    assert_drained(coalescer)


async def test_partial_abandonment_without_on_abandon_is_fine() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    jobs = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(2)]
    await settle()
    jobs[0].cancel()
    await settle()
    model.gate.set()
    assert await jobs[1] == "1"
    assert_drained(coalescer)


async def test_the_last_job_leaving_cancels_the_call_even_after_others_left_earlier() -> None:
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, on_abandon=abandoned.append)
    model.gate.clear()
    jobs = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(2)]
    await settle()
    jobs[0].cancel()
    await settle()
    assert model.cancelled == []
    jobs[1].cancel()
    await settle()
    assert abandoned == [["0"]]  # the last one cancels the call instead
    assert model.cancelled == [[["0"], ["1"]]]
    assert_drained(coalescer)


async def test_expiry_and_cancellation_together_free_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, max_in_flight=2, max_group_items=2, on_abandon=abandoned.append)
    model.gate.clear()
    tasks = [
        asyncio.create_task(coalescer.submit([str(i)], clock.now + 1 + i % 3)) for i in range(12)
    ]
    await settle()
    assert coalescer.stats.in_flight == 2
    tasks[0].cancel()
    tasks[5].cancel()
    tasks[11].cancel()
    await clock.advance(1)
    await clock.advance(1)
    model.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert_drained(coalescer)
    stats: CoalescerStats = coalescer.stats
    answered = [r for r in results if isinstance(r, str)]
    expired = [r for r in results if isinstance(r, DeadlineExpired)]
    cancelled = [r for r in results if isinstance(r, asyncio.CancelledError)]
    assert len(answered) + len(expired) + len(cancelled) == 12
    assert len(cancelled) == 3
    assert stats.expired == len(expired) > 0
    assert set(answered) <= {job[0] for job in model.sent}


async def test_a_cancellation_from_the_downstream_fails_its_waiters_but_is_not_theirs() -> None:
    """Nobody here cancelled the call, so its clients, still waiting, must not take the
    cancellation for their own leaving (which answers nothing): they get CallInterrupted."""
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    model.fail_with = asyncio.CancelledError()
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    await settle()
    model.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, CallInterrupted) for r in results), results
    assert coalescer.stats.cancelled_calls == 0
    model.fail_with = None
    assert await coalescer.submit(["after"]) == "after"  # the queue goes on
    assert_drained(coalescer)
