"""The coalescer: how concurrent jobs are grouped into calls, and what a failed call does.
Deadlines and cancellation are in test_coalescer_deadlines.py and
test_coalescer_cancellation.py."""

import asyncio

import pytest

from deployments.core.admission.coalescer import Coalescer
from tests.unit.coalescer_support import (
    FakeModel,
    assert_drained,
    make,
    settle,
    start_busy_call,
)


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        make(FakeModel(), max_in_flight=0)
    with pytest.raises(ValueError):
        make(FakeModel(), max_group_items=0)


async def test_a_lone_request_goes_out_at_once_in_its_own_call() -> None:
    model = FakeModel()
    coalescer = make(model)
    assert await coalescer.submit(["a", "b"]) == "a+b"
    assert model.calls == [[["a", "b"]]]
    assert model.time_left == [[None]]
    assert_drained(coalescer)


async def test_requests_arriving_while_the_call_is_busy_leave_together() -> None:
    model = FakeModel()
    coalescer = make(model)
    first = await start_busy_call(coalescer, model)
    waiting = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(2, 6)]
    await settle()
    assert len(model.calls) == 1  # the others wait for the busy call
    assert (coalescer.stats.queued_jobs, coalescer.stats.queued_items) == (4, 4)
    model.gate.set()
    results = await asyncio.gather(first, *waiting)
    assert results == ["x", "2", "3", "4", "5"]
    assert model.calls == [[["x"]], [["2"], ["3"], ["4"], ["5"]]]
    stats = coalescer.stats
    assert (stats.calls, stats.jobs, stats.items, stats.largest_call_jobs) == (2, 5, 5, 4)
    assert_drained(coalescer)


async def test_requests_arriving_in_the_same_loop_turn_leave_in_one_call() -> None:
    model = FakeModel()
    coalescer = make(model)
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    assert await asyncio.gather(*tasks) == ["0", "1", "2"]
    assert model.calls == [[["0"], ["1"], ["2"]]]


async def test_a_group_never_exceeds_max_group_items_but_a_big_job_still_goes() -> None:
    model = FakeModel()
    coalescer = make(model, max_group_items=3)
    blocker = await start_busy_call(coalescer, model)
    jobs = [["a", "b"], ["c", "d"], ["e", "f", "g", "h"], ["i"]]
    tasks = [asyncio.create_task(coalescer.submit(job)) for job in jobs]
    await settle()
    assert coalescer.stats.queued_items == 9
    model.gate.set()
    await asyncio.gather(blocker, *tasks)
    assert [sum(len(job) for job in call) for call in model.calls] == [1, 2, 2, 4, 1]
    assert_drained(coalescer)


async def test_calls_in_flight_never_exceed_the_limit() -> None:
    model = FakeModel()
    coalescer = make(model, max_in_flight=2)
    model.gate.clear()
    tasks = []
    for i in range(10):
        tasks.append(asyncio.create_task(coalescer.submit([str(i)])))
        await settle()
    assert coalescer.stats.in_flight == 2
    assert coalescer.stats.queued_jobs == 8
    model.gate.set()
    assert await asyncio.gather(*tasks) == [str(i) for i in range(10)]
    # Two lone calls filled the slots; the eight that waited left in one call.
    assert [len(call) for call in model.calls] == [1, 1, 8]
    assert_drained(coalescer)


# --- failures ---------------------------------------------------------------------------


async def test_a_failed_call_fails_every_request_in_it_and_nothing_hangs() -> None:
    model = FakeModel()
    coalescer = make(model, max_in_flight=1)
    model.gate.clear()
    model.fail_with = RuntimeError("model exploded")
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(4)]
    await settle()
    model.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and str(r) == "model exploded" for r in results)
    assert_drained(coalescer)


async def test_a_failed_call_does_not_stop_the_queue_behind_it() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.fail_on = "x"
    busy = await start_busy_call(coalescer, model)
    behind = asyncio.create_task(coalescer.submit(["later"]))
    await settle()
    model.gate.set()
    with pytest.raises(RuntimeError, match="cannot do x"):
        await busy
    assert await behind == "later"
    assert await coalescer.submit(["fresh"]) == "fresh"
    assert_drained(coalescer)


async def test_a_wrong_number_of_outcomes_is_an_error_for_every_request() -> None:
    async def short(
        jobs: list[list[str]], time_left: list[float | None], spent: list[float]
    ) -> list[str]:
        return ["only one"]

    coalescer: Coalescer[list[str], str] = Coalescer(
        short, size_of=len, max_in_flight=1, max_group_items=10
    )
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert_drained(coalescer)


async def test_the_downstreams_own_timeout_is_not_mistaken_for_the_deadline() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.fail_with = TimeoutError("downstream timed out")
    deadline = asyncio.get_running_loop().time() + 60
    with pytest.raises(TimeoutError, match="downstream timed out"):
        await coalescer.submit(["a"], deadline)
    assert coalescer.stats.expired == 0
    assert_drained(coalescer)


async def test_a_failure_reaches_the_jobs_left_in_a_call_after_one_has_gone() -> None:
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, on_abandon=abandoned.append)
    model.gate.clear()
    model.fail_with = RuntimeError("model exploded")
    leaving = asyncio.create_task(coalescer.submit(["gone"]))
    staying = asyncio.create_task(coalescer.submit(["kept"]))
    await settle()
    leaving.cancel()
    await settle()
    model.gate.set()
    with pytest.raises(RuntimeError):
        await staying
    assert leaving.cancelled()
    assert abandoned == [["gone"]]
    assert_drained(coalescer)
