"""The realtime lane: one more slot, for a realtime batch only, when the others are held."""

import asyncio

import pytest

from deployments.core.batching.priority_gate import PriorityGate
from deployments.core.priority import Priority
from tests.fakes import Clock

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


def laned() -> PriorityGate:
    return PriorityGate({RT: None, NORMAL: None, BATCH: 1.0}, clock=Clock(), lane=True)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_realtime_batch_takes_the_free_slot_before_the_lane() -> None:
    gate = laned()
    assert await gate.acquire(RT) is False  # the main threads are free: it gets them
    assert gate.stats.busy and not gate.stats.lane_busy


async def test_a_realtime_batch_runs_in_the_lane_beside_a_batch_class_pass() -> None:
    gate = laned()
    await gate.acquire(BATCH)
    assert await gate.acquire(RT) is True  # at once, not after the batch pass
    stats = gate.stats
    assert stats.lane_busy and stats.lane_turns == 1
    assert stats.turns == {"realtime": 1, "normal": 0, "batch": 1}
    gate.release(lane=True)
    assert not gate.stats.lane_busy and gate.stats.busy  # the batch pass still runs


async def test_only_realtime_takes_the_lane() -> None:
    gate = laned()
    await gate.acquire(BATCH)
    normal = asyncio.create_task(gate.acquire(NORMAL))
    await settle()
    assert not normal.done() and not gate.stats.lane_busy
    gate.release()
    assert await normal is False


async def test_a_second_realtime_batch_waits_for_whichever_slot_frees_first() -> None:
    gate = laned()
    await gate.acquire(BATCH)
    assert await gate.acquire(RT) is True
    second = asyncio.create_task(gate.acquire(RT))
    await settle()
    assert not second.done()
    assert gate.stats.waiting["realtime"] == 1
    gate.release(lane=True)  # the lane frees first
    assert await second is True
    third = asyncio.create_task(gate.acquire(RT))
    await settle()
    gate.release()  # now the batch pass ends: the main slot goes to the waiting one
    assert await third is False
    assert gate.stats.lane_busy and gate.stats.running == 1


async def test_a_lower_class_waits_for_the_lane_to_end_before_taking_the_free_slot() -> None:
    gate = laned()
    await gate.acquire(NORMAL)
    assert await gate.acquire(RT) is True
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    gate.release()  # the normal pass ends while the lane still runs: the slot stays free
    await settle()
    assert not batch.done() and gate.stats.running == 0
    gate.release(lane=True)
    assert await batch is False
    assert gate.stats.running == 1 and not gate.stats.lane_busy


async def test_a_batch_arriving_while_only_the_lane_runs_waits_for_it() -> None:
    gate = laned()
    await gate.acquire(NORMAL)
    assert await gate.acquire(RT) is True
    gate.release()  # the main slot is free, the lane busy
    normal = asyncio.create_task(gate.acquire(NORMAL))
    await settle()
    assert not normal.done() and gate.stats.waiting["normal"] == 1
    assert await gate.acquire(RT) is False  # realtime still takes the free slot at once
    gate.release(lane=True)
    gate.release()
    assert await normal is False


async def test_a_batch_that_waited_past_its_ageing_goes_beside_the_lane() -> None:
    clock = Clock()
    gate = PriorityGate({RT: None, NORMAL: None, BATCH: 1.0}, clock=clock, lane=True)
    await gate.acquire(NORMAL)
    assert await gate.acquire(RT) is True
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    clock.now += 1.0  # the batch class's aged_after_s: it never starves behind the lane
    gate.release()
    assert await batch is False
    assert gate.stats.lane_busy and gate.stats.running == 1


async def test_a_cancelled_lane_waiter_frees_nothing_it_did_not_hold() -> None:
    gate = laned()
    await gate.acquire(BATCH)
    await gate.acquire(RT)  # the lane
    waiter = asyncio.create_task(gate.acquire(RT))
    await settle()
    waiter.cancel()
    await settle()
    assert waiter.cancelled()
    gate.release(lane=True)
    assert not gate.stats.lane_busy
    assert gate.stats.waiting["realtime"] == 0 and gate.stats.running == 1


async def test_without_a_lane_realtime_waits_for_the_pass() -> None:
    gate = PriorityGate({RT: None, NORMAL: None, BATCH: 1.0}, clock=Clock())
    await gate.acquire(BATCH)
    realtime = asyncio.create_task(gate.acquire(RT))
    await settle()
    assert not realtime.done() and not gate.stats.lane
    gate.release()
    assert await realtime is False


async def test_a_realtime_batch_moves_to_the_lane_and_its_slot_waits_for_the_lane() -> None:
    gate = laned()
    assert await gate.acquire(RT) is False
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    assert not batch.done()
    gate.move_to_lane()  # its pass would wait for the device: beside it instead
    await settle()
    assert not batch.done()  # the slot it left waits for the lane to end
    assert gate.stats.lane_busy and gate.stats.lane_turns == 1
    assert gate.stats.turns["realtime"] == 1  # one batch, one turn
    gate.release(lane=True)
    assert await batch is False
    gate.release()
    assert not gate.stats.lane_busy and gate.stats.running == 0


async def test_moving_to_a_busy_lane_is_refused() -> None:
    gate = laned()
    await gate.acquire(BATCH)
    await gate.acquire(RT)  # the lane
    assert not gate.lane_free
    with pytest.raises(RuntimeError):
        gate.move_to_lane()


def held(clock: Clock, hold_s: float = 0.01) -> PriorityGate:
    return PriorityGate(
        {RT: None, NORMAL: 0.5, BATCH: 1.0}, clock=clock, lane=True, realtime_hold_s=hold_s
    )


async def test_after_a_realtime_pass_lower_classes_wait_out_the_hold() -> None:
    clock = Clock()
    gate = held(clock)
    assert await gate.acquire(RT) is False  # on the ordinary slot
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    gate.release(priority=RT)
    await settle()
    assert not batch.done() and gate.stats.running == 0  # kept for the next realtime batch
    clock.now += 0.01
    assert await asyncio.wait_for(batch, 5) is False  # the hold's end grants it
    assert gate.stats.running == 1


async def test_a_realtime_batch_in_the_hold_takes_the_free_slot_at_once() -> None:
    clock = Clock()
    gate = held(clock)
    await gate.acquire(BATCH)
    assert await gate.acquire(RT) is True  # the lane, beside the batch pass
    gate.release(priority=BATCH)
    gate.release(lane=True, priority=RT)  # the hold starts
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    assert not batch.done()
    assert await gate.acquire(RT) is False  # ahead of the waiting batch
    clock.now += 0.01
    gate.release(priority=RT)  # a new hold from now
    await settle()
    assert not batch.done()
    clock.now += 0.01
    assert await asyncio.wait_for(batch, 5) is False


async def test_normal_traffic_waits_for_the_lane_but_not_out_the_hold() -> None:
    clock = Clock()
    gate = held(clock, hold_s=10.0)
    await gate.acquire(BATCH)
    assert await gate.acquire(RT) is True
    gate.release(priority=BATCH)
    normal = asyncio.create_task(gate.acquire(NORMAL))
    await settle()
    assert not normal.done()  # the lane runs
    gate.release(lane=True, priority=RT)  # its pass ends, the batch class's hold starts
    assert await normal is False


async def test_a_batch_aged_past_its_limit_ends_its_wait_in_the_hold() -> None:
    clock = Clock()
    gate = held(clock, hold_s=10.0)
    await gate.acquire(RT)
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    clock.now += 1.0  # the batch class's aged_after_s
    gate.release(priority=RT)
    assert await batch is False


async def test_a_pass_of_a_lower_class_or_none_at_all_starts_no_hold() -> None:
    clock = Clock()
    gate = held(clock)
    await gate.acquire(NORMAL)
    batch = asyncio.create_task(gate.acquire(BATCH))
    await settle()
    gate.release(priority=NORMAL)
    assert await batch is False
    gate.release()  # a turn given back with no pass run
    assert await gate.acquire(BATCH) is False
