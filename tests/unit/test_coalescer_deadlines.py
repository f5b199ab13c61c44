"""The coalescer and deadlines: expired jobs are never sent, and a sent one expires on time."""

import asyncio
import time

import pytest

from deployments.core.admission.coalescer import Coalescer, DeadlineExpired
from tests.unit.coalescer_support import (
    FakeModel,
    LoopClock,
    assert_drained,
    make,
    settle,
    start_busy_call,
)


async def test_send_is_told_the_time_left_for_each_job(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    busy = await start_busy_call(coalescer, model)
    tasks = [
        asyncio.create_task(coalescer.submit(["a"], clock.now + 5)),
        asyncio.create_task(coalescer.submit(["b"])),
        asyncio.create_task(coalescer.submit(["c"], clock.now + 2)),
    ]
    await settle()
    await clock.advance(1.5)  # time spent queued counts against the deadline
    model.gate.set()
    assert await asyncio.gather(busy, *tasks) == ["x", "a", "b", "c"]
    assert model.time_left == [[None], [3.5, None, 0.5]]


async def test_a_job_whose_deadline_passes_while_queued_is_never_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    busy = await start_busy_call(coalescer, model)
    expiring = asyncio.create_task(coalescer.submit(["late", "r"], clock.now + 1))
    patient = asyncio.create_task(coalescer.submit(["kept"], clock.now + 10))
    await settle()
    assert coalescer.stats.queued_items == 3
    await clock.advance(1)
    with pytest.raises(DeadlineExpired):
        await expiring  # answered at its deadline, while the busy call is still open
    assert not busy.done()
    assert (coalescer.stats.queued_jobs, coalescer.stats.queued_items) == (1, 1)
    model.gate.set()
    assert await asyncio.gather(busy, patient) == ["x", "kept"]
    assert ["late", "r"] not in model.sent
    assert model.calls == [[["x"]], [["kept"]]]
    assert coalescer.stats.expired == 1
    assert_drained(coalescer)


async def test_a_job_already_past_its_deadline_is_never_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    with pytest.raises(DeadlineExpired):
        await coalescer.submit(["late"], clock.now - 1)
    assert model.calls == []
    assert coalescer.stats.expired == 1
    assert_drained(coalescer)
    assert await coalescer.submit(["next"]) == "next"


async def test_an_expired_job_at_the_head_of_the_queue_does_not_hold_up_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    expired = asyncio.create_task(coalescer.submit(["late"], clock.now))
    fresh = asyncio.create_task(coalescer.submit(["fresh"], clock.now + 1))
    assert await fresh == "fresh"
    with pytest.raises(DeadlineExpired):
        await expired
    assert model.calls == [[["fresh"]]]
    assert coalescer.stats.expired == 1
    assert_drained(coalescer)


async def test_an_expired_head_whose_client_also_left_does_not_strand_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    leaving = asyncio.create_task(coalescer.submit(["late"], clock.now))
    staying = asyncio.create_task(coalescer.submit(["kept"]))
    await asyncio.sleep(0)  # both queued; the dispatch is due next
    leaving.cancel()  # the client goes in the same loop turn the dispatcher meets it
    await settle()
    assert staying.done(), "the job behind the leaver was never sent"
    assert staying.result() == "kept"
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert model.sent == [["kept"]]
    assert_drained(coalescer)


async def test_a_job_whose_deadline_passes_after_it_was_sent_expires_on_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    job = asyncio.create_task(coalescer.submit(["slow"], clock.now + 1))
    await settle()
    assert model.sent == [["slow"]]
    await clock.advance(1)
    with pytest.raises(DeadlineExpired):
        await job  # at the deadline, without waiting for the call
    # It was the call's only job, so the call itself was cancelled.
    assert model.cancelled == [[["slow"]]]
    stats = coalescer.stats
    assert (stats.expired, stats.abandoned, stats.cancelled_calls) == (1, 1, 1)
    assert_drained(coalescer)


async def test_an_outcome_arriving_after_the_deadline_is_discarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, on_abandon=abandoned.append)
    model.gate.clear()
    late = asyncio.create_task(coalescer.submit(["late"], clock.now + 1))
    other = asyncio.create_task(coalescer.submit(["other"]))
    await settle()
    assert model.calls == [[["late"], ["other"]]]
    await clock.advance(1)
    with pytest.raises(DeadlineExpired):
        await late
    assert abandoned == [["late"]]  # the caller may tell the model to skip it
    assert model.cancelled == []  # the call still serves another job
    model.gate.set()
    assert await other == "other"
    assert late.exception().__class__ is DeadlineExpired  # not overwritten by the outcome
    stats = coalescer.stats
    assert (stats.expired, stats.abandoned, stats.cancelled_calls) == (1, 1, 0)
    assert_drained(coalescer)


async def test_an_answer_arriving_as_the_deadline_fires_is_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    deadline = clock.now + 1

    async def answers_at_the_deadline(
        jobs: list[list[str]], time_left: list[float | None], spent: list[float]
    ) -> list[str]:
        clock.now = deadline  # the deadline's timer is due in the next loop turn ...
        await asyncio.sleep(0)
        return ["done"]  # ... and runs right after this answer, in that same turn

    coalescer: Coalescer[list[str], str] = Coalescer(
        answers_at_the_deadline, size_of=len, max_in_flight=1, max_group_items=10
    )
    outcome = await asyncio.gather(coalescer.submit(["a"], deadline), return_exceptions=True)
    assert outcome == ["done"]
    assert_drained(coalescer)


async def test_send_is_told_how_long_each_job_has_been_at_the_ingress() -> None:
    model = FakeModel()
    coalescer = make(model)
    then = time.monotonic()
    job = asyncio.create_task(coalescer.submit(["a"], since=then - 2.0))
    assert await job == "a"
    later = asyncio.create_task(coalescer.submit(["b"]))  # since: when it was queued
    assert await later == "b"
    ((early,), (fresh,)) = model.spent
    assert 2.0 <= early < 2.0 + (time.monotonic() - then)
    assert 0.0 <= fresh < 1.0
