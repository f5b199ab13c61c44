import asyncio

import pytest

from deployments.core.admission.admission import ClassLimits
from deployments.core.admission.class_queues import (
    ClassQueues,
    ClassSettings,
    Refused,
    loop_deadline,
)
from deployments.core.admission.coalescer import DeadlineExpired
from deployments.core.admission.throughput import RateMeter
from deployments.core.priority import Priority
from tests.fakes import Clock

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


class FakeModel:
    """One class's downstream: records calls; `gate` holds them open."""

    def __init__(self) -> None:
        self.calls: list[list[list[str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def send(
        self, jobs: list[list[str]], time_left: list[float | None], spent: list[float]
    ) -> list[str]:
        self.calls.append(jobs)
        await self.gate.wait()
        return ["+".join(job) for job in jobs]


SETTINGS = {
    RT: ClassSettings(ClassLimits(max_queued_items=4), max_in_flight=1),
    NORMAL: ClassSettings(ClassLimits(50, shed_above_queued_items=20), max_in_flight=1),
    BATCH: ClassSettings(ClassLimits(30, shed_above_queued_items=10), max_in_flight=1),
}


def make(
    settings: dict[Priority, ClassSettings] = SETTINGS, **options: object
) -> tuple[ClassQueues[list[str], str], dict[Priority, FakeModel]]:
    models = {p: FakeModel() for p in Priority}
    # The queues' own mechanics, under the fixed bounds: the prediction has its own tests
    # (test_class_queues_wait.py).
    options.setdefault("predict_wait", False)
    queues: ClassQueues[list[str], str] = ClassQueues(
        lambda p: models[p].send,
        settings,
        size_of=len,
        max_group_items=100,
        **options,  # type: ignore[arg-type]
    )
    return queues, models


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def hold_busy(
    queues: ClassQueues[list[str], str], models: dict[Priority, FakeModel], priority: Priority
) -> asyncio.Task[str]:
    """Open a call for `priority` and hold it, so that its next jobs queue."""
    models[priority].gate.clear()
    busy = asyncio.create_task(queues.submit(priority, ["busy"], None))
    await settle()
    return busy


def test_every_class_needs_settings() -> None:
    with pytest.raises(ValueError, match="realtime"):
        make({NORMAL: SETTINGS[NORMAL], BATCH: SETTINGS[BATCH]})


async def test_each_class_goes_to_its_own_downstream() -> None:
    queues, models = make()
    assert await queues.submit(RT, ["r"], None) == "r"
    assert await queues.submit(NORMAL, ["n"], None) == "n"
    assert await queues.submit(BATCH, ["b"], None) == "b"
    assert [m.calls for m in models.values()] == [[[["r"]]], [[["n"]]], [[["b"]]]]


async def test_realtime_goes_out_while_the_batch_class_call_is_held_open() -> None:
    queues, models = make()
    busy = await hold_busy(queues, models, BATCH)
    queued_batch = asyncio.create_task(queues.submit(BATCH, ["b1", "b2"], None))
    await settle()
    assert queues.queued_items() == {RT: 0, NORMAL: 0, BATCH: 2}
    # Realtime has its own coalescer and call slot: it does not wait for the batch call.
    assert await queues.submit(RT, ["urgent"], None) == "urgent"
    assert models[RT].calls == [[["urgent"]]]
    assert not busy.done() and not queued_batch.done()
    models[BATCH].gate.set()
    assert await asyncio.gather(busy, queued_batch) == ["busy", "b1+b2"]
    assert models[BATCH].calls == [[["busy"]], [["b1", "b2"]]]
    assert queues.queued_items() == {RT: 0, NORMAL: 0, BATCH: 0}


async def test_the_batch_class_is_shed_first_and_the_refusal_is_counted() -> None:
    queues, models = make()
    for p in Priority:
        await hold_busy(queues, models, p)
    waiting = [asyncio.create_task(queues.submit(NORMAL, ["n"] * 5, None)) for _ in range(2)]
    await settle()
    assert queues.queued_items() == {RT: 0, NORMAL: 10, BATCH: 0}
    with pytest.raises(Refused) as shed:
        await queues.submit(BATCH, ["b"], None)  # 11 > batch threshold of 10
    assert shed.value.priority is BATCH
    assert (shed.value.refusal.reason, shed.value.refusal.status) == ("shed", 429)
    # normal (threshold 20) and realtime (never shed) still get in
    waiting.append(asyncio.create_task(queues.submit(NORMAL, ["n"], None)))
    waiting.append(asyncio.create_task(queues.submit(RT, ["r"], None)))
    await settle()
    assert queues.queued_items() == {RT: 1, NORMAL: 11, BATCH: 0}
    stats = queues.stats()
    assert stats["classes"]["batch"]["refused"] == {"shed": 1}
    assert stats["classes"]["normal"]["refused"] == {}
    assert stats["classes"]["batch"]["queued_items"] == 0
    assert stats["classes"]["normal"]["queued_items"] == 11
    for model in models.values():
        model.gate.set()
    await asyncio.gather(*waiting)


async def test_realtime_is_refused_with_503_only_at_its_own_bound() -> None:
    queues, models = make()
    await hold_busy(queues, models, RT)
    waiting = [asyncio.create_task(queues.submit(RT, ["r", "r"], None)) for _ in range(2)]
    await settle()
    assert queues.queued_items()[RT] == 4
    with pytest.raises(Refused) as full:
        await queues.submit(RT, ["r"], None)
    assert (full.value.refusal.reason, full.value.refusal.status) == ("queue_full", 503)
    with pytest.raises(Refused):
        await queues.submit(RT, ["r"], None)
    assert queues.stats()["classes"]["realtime"]["refused"] == {"queue_full": 2}
    models[RT].gate.set()
    assert await asyncio.gather(*waiting) == ["r+r", "r+r"]
    assert await queues.submit(RT, ["r"], None) == "r"  # room again once drained


async def test_retry_after_comes_from_the_measured_throughput() -> None:
    clock = Clock()
    queues, models = make(meter=RateMeter(window_s=10, clock=clock))
    for _ in range(4):
        await queues.submit(NORMAL, ["n"] * 5, None)  # 20 items done ...
        clock.now += 1
    clock.now -= 1
    assert queues.stats()["items_per_s"] == pytest.approx(6.7, abs=0.05)  # ... over 3 s
    clock.now += 1  # 20 items over 4 s: 5 items/s
    await hold_busy(queues, models, BATCH)
    waiting = asyncio.create_task(queues.submit(BATCH, ["b"] * 30, None))
    await settle()
    with pytest.raises(Refused) as full:
        await queues.submit(BATCH, ["b"] * 5, None)
    assert full.value.refusal.reason == "queue_full"
    assert full.value.refusal.retry_after_s == 7  # ceil((30 + 5) / 5)
    models[BATCH].gate.set()
    await waiting


async def test_only_answered_items_count_as_throughput() -> None:
    clock = Clock()
    meter = RateMeter(clock=clock)
    queues, models = make(meter=meter)
    await hold_busy(queues, models, RT)
    waiting = [asyncio.create_task(queues.submit(RT, ["r"] * 2, None)) for _ in range(2)]
    await settle()
    with pytest.raises(Refused):
        await queues.submit(RT, ["r"] * 3, None)
    assert meter.rate() == 0.0
    models[RT].gate.set()
    await asyncio.gather(*waiting)
    assert meter.rate() == 5.0  # busy (1) + 2 + 2 items, within the first second


async def test_a_deadline_passing_in_a_class_queue_raises_deadline_expired() -> None:
    queues, models = make()
    busy = await hold_busy(queues, models, NORMAL)
    late = asyncio.create_task(queues.submit(NORMAL, ["late"], loop_deadline(0.001)))
    await settle()
    with pytest.raises(DeadlineExpired):
        await late
    assert queues.queued_items()[NORMAL] == 0
    models[NORMAL].gate.set()
    await busy
    assert models[NORMAL].calls == [[["busy"]]]
    stats = queues.stats()["classes"]["normal"]
    assert (stats["expired"], stats["refused"], stats["in_flight"]) == (1, {}, 0)


async def test_on_abandon_reaches_every_class() -> None:
    abandoned: list[list[str]] = []
    queues, models = make(on_abandon=abandoned.append)
    models[BATCH].gate.clear()
    jobs = [asyncio.create_task(queues.submit(BATCH, [str(i)], None)) for i in range(2)]
    await settle()
    jobs[0].cancel()
    await settle()
    assert abandoned == [["0"]]
    models[BATCH].gate.set()
    assert await jobs[1] == "1"


async def test_stats_cover_every_class() -> None:
    queues, _ = make()
    await queues.submit(NORMAL, ["a", "b"], None)
    stats = queues.stats()
    assert set(stats) == {"items_per_s", "predicted_wait", "classes"}
    assert set(stats["classes"]) == {"realtime", "normal", "batch"}
    normal = stats["classes"]["normal"]
    assert (normal["calls"], normal["jobs"], normal["items"]) == (1, 1, 2)
    assert {"queued_jobs", "queued_items", "in_flight", "refused"} <= set(normal)


async def test_loop_deadline_is_on_the_running_loops_clock() -> None:
    assert loop_deadline(None) is None
    before = asyncio.get_running_loop().time()
    deadline = loop_deadline(2.5)
    assert deadline is not None
    assert before + 2.5 <= deadline <= asyncio.get_running_loop().time() + 2.5
