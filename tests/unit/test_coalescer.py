import asyncio

import pytest

from deployments.core.coalescer import Coalescer, QueueFull


class FakeModel:
    """Records every call; `gate` holds calls open until the test releases them."""

    def __init__(self) -> None:
        self.calls: list[list[list[str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_with: Exception | None = None

    async def send(self, jobs: list[list[str]]) -> list[str]:
        self.calls.append(jobs)
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return ["+".join(job) for job in jobs]


def make(model: FakeModel, **overrides: int) -> Coalescer[list[str], str]:
    bounds = {"max_in_flight": 1, "max_group_items": 100, "max_pending_items": 100}
    bounds.update(overrides)
    return Coalescer(model.send, size_of=len, **bounds)


async def test_a_lone_request_goes_out_at_once_in_its_own_call() -> None:
    model = FakeModel()
    assert await make(model).submit(["a", "b"]) == "a+b"
    assert model.calls == [[["a", "b"]]]


async def test_requests_arriving_while_the_call_is_busy_leave_together() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    first = asyncio.create_task(coalescer.submit(["1"]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(2, 6)]
    await asyncio.sleep(0)
    assert len(model.calls) == 1  # the others wait for the busy call
    model.gate.set()
    results = await asyncio.gather(first, *waiting)
    assert results == ["1", "2", "3", "4", "5"]
    assert model.calls == [[["1"]], [["2"], ["3"], ["4"], ["5"]]]
    assert coalescer.stats.calls == 2 and coalescer.stats.jobs == 5


async def test_a_group_never_exceeds_max_group_items_but_a_big_job_still_goes() -> None:
    model = FakeModel()
    coalescer = make(model, max_group_items=3)
    model.gate.clear()
    blocker = asyncio.create_task(coalescer.submit(["x"]))
    await asyncio.sleep(0)
    jobs = [["a", "b"], ["c", "d"], ["e", "f", "g", "h"], ["i"]]
    tasks = [asyncio.create_task(coalescer.submit(job)) for job in jobs]
    await asyncio.sleep(0)
    model.gate.set()
    await asyncio.gather(blocker, *tasks)
    assert [sum(len(job) for job in call) for call in model.calls] == [1, 2, 2, 4, 1]


async def test_a_failed_call_fails_every_request_in_it_and_nothing_hangs() -> None:
    model = FakeModel()
    coalescer = make(model, max_in_flight=1)
    model.gate.clear()
    model.fail_with = RuntimeError("model exploded")
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(4)]
    await asyncio.sleep(0)
    model.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 2)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert coalescer.stats.in_flight == 0 and coalescer.stats.pending_items == 0


async def test_a_wrong_number_of_outcomes_is_an_error_for_every_request() -> None:
    async def short(jobs: list[list[str]]) -> list[str]:
        return ["only one"]

    coalescer: Coalescer[list[str], str] = Coalescer(
        short, size_of=len, max_in_flight=1, max_group_items=10, max_pending_items=10
    )
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_the_pending_bound_refuses_new_work_instead_of_queueing_it() -> None:
    model = FakeModel()
    coalescer = make(model, max_pending_items=3)
    model.gate.clear()
    busy = asyncio.create_task(coalescer.submit(["x"]))
    await asyncio.sleep(0)
    queued = asyncio.create_task(coalescer.submit(["a", "b"]))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):
        await coalescer.submit(["c", "d"])
    assert coalescer.stats.rejected == 1
    model.gate.set()
    assert await asyncio.gather(busy, queued) == ["x", "a+b"]


async def test_a_job_larger_than_the_bound_is_served_when_nothing_waits() -> None:
    model = FakeModel()
    assert await make(model, max_pending_items=2).submit(["a", "b", "c"]) == "a+b+c"


async def test_a_request_cancelled_while_waiting_is_never_sent() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    busy = asyncio.create_task(coalescer.submit(["x"]))
    await asyncio.sleep(0)
    leaving = asyncio.create_task(coalescer.submit(["gone"]))
    staying = asyncio.create_task(coalescer.submit(["kept"]))
    await asyncio.sleep(0)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert coalescer.stats.pending_items == 1
    model.gate.set()
    assert await asyncio.gather(busy, staying) == ["x", "kept"]
    assert ["gone"] not in [job for call in model.calls for job in call]
    assert coalescer.stats.pending_items == 0


async def test_calls_in_flight_never_exceed_the_limit() -> None:
    model = FakeModel()
    coalescer = make(model, max_in_flight=2)
    model.gate.clear()
    tasks = []
    for i in range(10):
        tasks.append(asyncio.create_task(coalescer.submit([str(i)])))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    assert coalescer.stats.in_flight == 2
    assert coalescer.stats.pending_items == 8
    model.gate.set()
    assert await asyncio.gather(*tasks) == [str(i) for i in range(10)]
    # Two lone calls filled the slots; the eight that waited left in one call.
    assert [len(call) for call in model.calls] == [1, 1, 8]
