"""SequenceSlots: the admission queue in front of a generation engine, with a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from deployments.core.batching.sequence_slots import (
    QueueFull,
    SequenceSlots,
    SlotLimits,
    SlotTimeout,
)
from deployments.core.priority import Priority
from tests.fakes import Clock

R, N, B = Priority.REALTIME, Priority.NORMAL, Priority.BATCH


def limits(seqs: int = 1, tokens: int = 1000, queued: int = 10, aged: float | None = None):
    return SlotLimits(
        max_num_seqs=seqs,
        max_tokens=tokens,
        max_queued=dict.fromkeys(Priority, queued),
        aged_after_s={R: None, N: None, B: aged},
    )


async def test_realtime_is_admitted_before_earlier_batch_and_normal() -> None:
    slots = SequenceSlots(limits(seqs=1))
    running = await slots.acquire(N, 10, None)
    order: list[str] = []

    async def wait(priority: Priority, name: str) -> None:
        slot = await slots.acquire(priority, 10, None)
        order.append(name)
        slots.release(slot)

    tasks = [asyncio.create_task(wait(B, "batch")), asyncio.create_task(wait(N, "normal"))]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(wait(R, "realtime")))
    await asyncio.sleep(0)
    assert slots.stats.waiting == {"realtime": 1, "normal": 1, "batch": 1}
    slots.release(running)
    await asyncio.gather(*tasks)
    assert order == ["realtime", "normal", "batch"]


async def test_aged_batch_request_goes_ahead_of_newer_realtime() -> None:
    clock = Clock(100.0)
    slots = SequenceSlots(limits(seqs=1, aged=5.0), clock=clock)
    running = await slots.acquire(N, 10, None)
    batch = asyncio.create_task(slots.acquire(B, 10, None))
    await asyncio.sleep(0)
    clock.now += 6.0  # the batch request has waited past its aged_after_s
    realtime = asyncio.create_task(slots.acquire(R, 10, None))
    await asyncio.sleep(0)
    slots.release(running)
    granted = await batch
    assert not realtime.done()
    assert slots.stats.granted["batch"] == 1 and slots.stats.granted["realtime"] == 0
    assert slots.stats.aged_grants == 1
    slots.release(granted)
    slots.release(await realtime)


async def test_token_budget_holds_back_a_request_that_does_not_fit() -> None:
    slots = SequenceSlots(limits(seqs=8, tokens=100))
    first = await slots.acquire(N, 70, None)
    second = asyncio.create_task(slots.acquire(N, 40, None))
    await asyncio.sleep(0)
    assert not second.done() and slots.stats.running_tokens == 70
    slots.release(first)
    slot = await second
    assert slots.stats.running == 1 and slots.stats.running_tokens == 40
    slots.release(slot)


async def test_oversized_request_runs_alone_on_an_idle_replica() -> None:
    slots = SequenceSlots(limits(seqs=2, tokens=100))
    slot = await slots.acquire(N, 500, None)
    assert slots.stats.running == 1
    slots.release(slot)
    assert slots.stats.running == 0 and slots.stats.running_tokens == 0


async def test_deadline_passing_while_waiting_raises_and_frees_the_queue() -> None:
    slots = SequenceSlots(limits(seqs=1))
    running = await slots.acquire(N, 10, None)
    loop_deadline = slots._clock() + 0.05
    with pytest.raises(SlotTimeout):
        await slots.acquire(N, 10, loop_deadline)
    assert slots.stats.waiting["normal"] == 0 and slots.stats.timed_out == 1
    slots.release(running)
    assert slots.stats.running == 0


async def test_full_class_queue_is_refused_at_once() -> None:
    slots = SequenceSlots(limits(seqs=1, queued=1))
    running = await slots.acquire(N, 10, None)
    waiting = asyncio.create_task(slots.acquire(B, 10, None))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull) as refused:
        await slots.acquire(B, 10, None)
    assert (refused.value.queued, refused.value.limit) == (1, 1)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    slots.release(running)
    assert slots.stats.waiting["batch"] == 0 and slots.stats.running == 0


async def test_cancelled_waiter_leaves_and_the_next_one_is_granted() -> None:
    slots = SequenceSlots(limits(seqs=1))
    running = await slots.acquire(N, 10, None)
    gone = asyncio.create_task(slots.acquire(R, 10, None))
    stays = asyncio.create_task(slots.acquire(N, 10, None))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    slots.release(running)
    slots.release(await stays)
    assert slots.stats.running == 0


async def test_raising_the_limit_admits_waiting_requests() -> None:
    slots = SequenceSlots(limits(seqs=1))
    running = await slots.acquire(N, 10, None)
    waiting = asyncio.create_task(slots.acquire(N, 10, None))
    await asyncio.sleep(0)
    slots.set_limits(limits(seqs=2))
    slot = await waiting
    assert slots.stats.running == 2
    slots.release(slot)
    slots.release(running)
