import asyncio

import pytest

from deployments.core.batching.priority_gate import PriorityGate
from deployments.core.priority import Priority
from tests.fakes import Clock

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


def make(batch_aged_after_s: float | None = 1.0) -> tuple[PriorityGate, Clock]:
    clock = Clock()
    gate = PriorityGate({RT: None, NORMAL: None, BATCH: batch_aged_after_s}, clock=clock)
    return gate, clock


async def settle() -> None:
    """Let every runnable task run up to its next wait."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_idle_gate_grants_a_turn_at_once() -> None:
    gate, _ = make()
    async with gate.turn(BATCH):
        assert gate.stats.busy
    assert not gate.stats.busy
    assert gate.stats.turns == {"realtime": 0, "normal": 0, "batch": 1}


async def test_when_the_model_frees_up_realtime_goes_before_normal_before_batch() -> None:
    gate, _ = make()
    order: list[str] = []

    async def batch_of(name: str, priority: Priority) -> None:
        async with gate.turn(priority):
            order.append(name)

    await gate.acquire(NORMAL)  # the model is busy with a batch
    names = [("b1", BATCH), ("n1", NORMAL), ("r1", RT), ("b2", BATCH), ("n2", NORMAL)]
    tasks = []
    for name, priority in names:
        tasks.append(asyncio.create_task(batch_of(name, priority)))
        await settle()
    assert order == []
    assert gate.stats.waiting == {"realtime": 1, "normal": 2, "batch": 2}
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["r1", "n1", "n2", "b1", "b2"]
    assert not gate.stats.busy
    assert gate.stats.waiting == {"realtime": 0, "normal": 0, "batch": 0}
    assert gate.stats.turns == {"realtime": 1, "normal": 3, "batch": 2}


async def test_a_realtime_batch_arriving_while_one_runs_goes_next() -> None:
    gate, _ = make()
    order: list[str] = []
    running = asyncio.Event()
    finish = asyncio.Event()

    async def batch_of(name: str, priority: Priority, hold: bool = False) -> None:
        async with gate.turn(priority):
            order.append(name)
            if hold:
                running.set()
                await finish.wait()

    first = asyncio.create_task(batch_of("b1", BATCH, hold=True))
    await running.wait()
    later = [asyncio.create_task(batch_of(f"b{i}", BATCH)) for i in (2, 3)]
    await settle()
    urgent = asyncio.create_task(batch_of("r1", RT))
    await settle()
    finish.set()
    await asyncio.gather(first, *later, urgent)
    assert order == ["b1", "r1", "b2", "b3"]


async def test_turns_of_one_class_are_granted_in_arrival_order() -> None:
    gate, _ = make()
    order: list[int] = []

    async def batch_of(i: int) -> None:
        async with gate.turn(NORMAL):
            order.append(i)

    await gate.acquire(RT)
    tasks = []
    for i in range(8):
        tasks.append(asyncio.create_task(batch_of(i)))
        await settle()
    gate.release()
    await asyncio.gather(*tasks)
    assert order == list(range(8))


async def grant_in_turn(gate: PriorityGate, clock: Clock, steps: int) -> list[str]:
    """A continuous realtime stream: every 0.3 s one more realtime batch waits and the
    model frees up. Returns who got each turn; a batch-class turn waits from t=0."""
    await gate.acquire(RT)
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    granted: list[str] = []
    waiting: list[asyncio.Task[None]] = []
    for i in range(steps):
        waiting.append(asyncio.create_task(gate.acquire(RT)))
        await settle()
        clock.now += 0.3
        gate.release()
        await settle()
        if batch.done() and "batch" not in granted:
            granted.append("batch")
        for j, task in enumerate(waiting):
            if task.done() and f"r{j}" not in granted:
                granted.append(f"r{j}")
        assert len(granted) == i + 1  # exactly one turn per release
    for task in [batch, *waiting]:
        task.cancel()
    await asyncio.gather(batch, *waiting, return_exceptions=True)
    return granted


async def test_ageing_bounds_the_batch_class_wait_under_a_realtime_stream() -> None:
    gate, clock = make(batch_aged_after_s=1.0)
    granted = await grant_in_turn(gate, clock, steps=8)
    # Realtime goes first while the batch turn is young; at t=1.2 it has waited past
    # 1.0 s, so it goes before the realtime turn that is waiting then.
    assert granted.index("batch") == 3
    assert granted == ["r0", "r1", "r2", "batch", "r3", "r4", "r5", "r6"]
    assert gate.stats.aged_turns == 1
    assert gate.stats.turns["batch"] == 1


async def test_without_ageing_the_batch_class_waits_as_long_as_realtime_keeps_coming() -> None:
    gate, clock = make(batch_aged_after_s=None)
    granted = await grant_in_turn(gate, clock, steps=8)
    assert "batch" not in granted
    assert gate.stats.aged_turns == 0


async def test_set_aged_after_s_takes_effect_for_turns_already_waiting() -> None:
    gate, clock = make(batch_aged_after_s=None)
    await gate.acquire(RT)
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    realtime = asyncio.create_task(gate.acquire(RT))
    await settle()
    clock.now += 5
    gate.set_aged_after_s({BATCH: 2.0})
    gate.release()
    await settle()
    assert batch.done() and not realtime.done()
    gate.release()
    await realtime
    gate.release()
    assert not gate.stats.busy


async def test_an_aged_turn_that_would_have_gone_anyway_is_not_counted_as_aged() -> None:
    gate, clock = make(batch_aged_after_s=1.0)
    await gate.acquire(RT)
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    clock.now += 10
    gate.release()
    await batch
    assert gate.stats.aged_turns == 0
    gate.release()


async def test_the_oldest_aged_turn_goes_first() -> None:
    clock = Clock()
    gate = PriorityGate({RT: None, NORMAL: 0.5, BATCH: 1.0}, clock=clock)
    await gate.acquire(RT)
    batch = asyncio.create_task(gate.acquire(BATCH))  # waits from t=0
    await settle()
    clock.now = 0.2
    normal = asyncio.create_task(gate.acquire(NORMAL))  # waits from t=0.2
    await settle()
    clock.now = 1.5  # both aged; batch has waited longer
    gate.release()
    await settle()
    assert batch.done() and not normal.done()
    gate.release()
    await normal
    gate.release()
    assert not gate.stats.busy


async def test_a_waiting_turn_that_is_cancelled_leaves_the_gate_usable() -> None:
    gate, _ = make()
    await gate.acquire(NORMAL)
    leaving = asyncio.create_task(gate.acquire(RT))
    staying = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert gate.stats.waiting == {"realtime": 0, "normal": 0, "batch": 1}
    gate.release()
    await staying  # the batch turn is next, not a ghost of the cancelled one
    assert gate.stats.turns == {"realtime": 0, "normal": 1, "batch": 1}
    gate.release()
    assert not gate.stats.busy
    async with gate.turn(RT):  # free again: granted at once
        pass
    assert not gate.stats.busy


async def test_a_turn_cancelled_as_it_is_granted_passes_it_on() -> None:
    gate, _ = make()
    await gate.acquire(NORMAL)
    granted = asyncio.create_task(gate.acquire(RT))
    after = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    gate.release()  # the realtime turn is granted ...
    granted.cancel()  # ... and its task cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await granted
    await after  # the turn went on to the next in line
    gate.release()
    assert not gate.stats.busy
    assert gate.stats.waiting == {"realtime": 0, "normal": 0, "batch": 0}


async def test_a_turn_cancelled_as_it_is_granted_frees_the_gate_when_none_waits() -> None:
    gate, _ = make()
    await gate.acquire(NORMAL)
    granted = asyncio.create_task(gate.acquire(RT))
    await settle()
    gate.release()
    granted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granted
    assert not gate.stats.busy
    async with gate.turn(BATCH):
        pass


async def test_a_turn_cancelled_just_before_the_gate_frees_up_is_skipped() -> None:
    gate, _ = make()
    await gate.acquire(NORMAL)
    leaving = asyncio.create_task(gate.acquire(RT))
    staying = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    # The client leaves and the model frees up in the same loop turn, before the
    # cancelled task has run: the gate must not hand its turn to the leaver.
    leaving.cancel()
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    await staying
    gate.release()
    assert not gate.stats.busy
    assert gate.stats.waiting == {"realtime": 0, "normal": 0, "batch": 0}
    async with gate.turn(RT):
        pass


async def test_a_turn_cancelled_just_before_the_gate_frees_up_with_none_behind() -> None:
    gate, _ = make()
    await gate.acquire(NORMAL)
    leaving = asyncio.create_task(gate.acquire(RT))
    await settle()
    leaving.cancel()
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert not gate.stats.busy
    assert gate.stats.waiting == {"realtime": 0, "normal": 0, "batch": 0}
    async with gate.turn(BATCH):
        pass


async def test_a_batch_cancelled_while_it_holds_the_turn_releases_it() -> None:
    gate, _ = make()
    running = asyncio.Event()

    async def forward_pass() -> None:
        async with gate.turn(BATCH):
            running.set()
            await asyncio.Event().wait()  # never finishes by itself

    task = asyncio.create_task(forward_pass())
    await running.wait()
    waiting = asyncio.create_task(gate.acquire(RT))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await waiting
    gate.release()
    assert not gate.stats.busy


async def test_a_batch_that_fails_releases_its_turn() -> None:
    gate, _ = make()
    with pytest.raises(RuntimeError):
        async with gate.turn(NORMAL):
            raise RuntimeError("model exploded")
    assert not gate.stats.busy
    async with gate.turn(NORMAL):
        pass


async def test_a_gate_of_two_passes_grants_two_turns_then_queues_by_class() -> None:
    gate = PriorityGate({RT: None, NORMAL: None, BATCH: None}, capacity=2)
    await gate.acquire(BATCH)
    assert not gate.stats.busy and gate.stats.running == 1
    await gate.acquire(BATCH)
    assert gate.stats.busy and gate.stats.running == 2
    order: list[str] = []
    finish = asyncio.Event()

    async def batch_of(name: str, priority: Priority) -> None:
        async with gate.turn(priority):
            order.append(name)
            await finish.wait()

    tasks = [asyncio.create_task(batch_of(n, p)) for n, p in (("b", BATCH), ("r", RT))]
    await settle()
    assert order == [] and gate.stats.waiting == {"realtime": 1, "normal": 0, "batch": 1}
    gate.release()  # one slot frees: the realtime batch takes it, not the older batch one
    await settle()
    assert order == ["r"] and gate.stats.running == 2
    gate.release()
    await settle()
    assert order == ["r", "b"]
    finish.set()
    await asyncio.gather(*tasks)
    assert order == ["r", "b"]
    assert gate.stats.running == 0 and gate.stats.capacity == 2


async def test_raising_the_capacity_grants_waiting_turns_at_once() -> None:
    gate, _ = make()
    await gate.acquire(NORMAL)
    waiting = asyncio.create_task(gate.acquire(NORMAL))
    await settle()
    assert not waiting.done()
    gate.set_capacity(2)
    await settle()
    assert waiting.done() and gate.stats.running == 2
    gate.release()
    gate.release()
    assert gate.stats.running == 0 and not gate.stats.busy


async def test_the_gate_says_the_most_urgent_class_waiting_and_when_one_came() -> None:
    gate, clock = make()
    await gate.acquire(BATCH)
    assert gate.most_urgent_waiting() is None
    gate.waiter_came.clear()
    waiting = [asyncio.create_task(gate.acquire(p)) for p in (BATCH, RT)]
    await settle()
    assert gate.waiter_came.is_set()
    clock.now += 5.0  # the batch-class turn has aged: it goes next, but realtime waits
    assert gate.next_waiting() is BATCH and gate.most_urgent_waiting() is RT
    for _ in waiting:
        gate.release()
        await settle()
    gate.release()
    assert all(task.done() for task in waiting)
