"""Turns at a shared device (core/device_turns): the order, the table and its safety, with
fake clocks and pids in one process, then real processes contending for one table."""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from deployments.core.device_turns.order import Waiter, next_waiter
from deployments.core.device_turns.pause import Signal, send_signal
from deployments.core.device_turns.table import HOLDING, TurnTable
from deployments.core.device_turns.turns import (
    STOPPED_HOLDER_S,
    DeviceTurns,
    TurnSettings,
    pid_stopped,
)

REALTIME, NORMAL, BATCH = 0, 1, 2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def waiter(slot: int, **kw: float) -> Waiter:
    fields: dict[str, float] = dict(
        model_key=slot, klass=BATCH, priority=0, urgent_at=math.inf, since=0.0, min_share=0.0
    )
    fields.update(kw)
    return Waiter(slot=slot, weight=1, **fields)  # type: ignore[arg-type]


def test_class_goes_before_model_priority_and_priority_before_the_clock() -> None:
    batch_high = waiter(0, klass=BATCH, priority=10)
    realtime_low = waiter(1, klass=REALTIME, priority=0)
    assert next_waiter([batch_high, realtime_low], {}) == realtime_low
    early = waiter(2, priority=0, urgent_at=5.0)
    favoured = waiter(3, priority=1, urgent_at=50.0)
    assert next_waiter([early, favoured], {}) == favoured
    later = waiter(4, urgent_at=6.0, since=0.0)
    assert next_waiter([later, early], {}) == early
    first_come = waiter(5, since=1.0)
    assert next_waiter([waiter(6, since=2.0), first_come], {}) == first_come


def test_between_equals_the_smaller_share_goes_first_then_the_first_come() -> None:
    long_passes = waiter(0, since=1.0)
    short_steps = waiter(1, since=2.0)
    assert next_waiter([long_passes, short_steps], {0: 0.7, 1: 0.3}) == short_steps
    assert next_waiter([long_passes, short_steps], {0: 0.5, 1: 0.5}) == long_passes
    # Share comes after class, priority and a near deadline.
    urgent = waiter(2, urgent_at=5.0)
    assert next_waiter([urgent, short_steps], {2: 0.9, 1: 0.1}) == urgent
    favoured = waiter(3, priority=1)
    assert next_waiter([favoured, short_steps], {3: 0.9, 1: 0.1}) == favoured


def test_a_model_below_its_min_share_goes_first_whatever_its_class() -> None:
    starved = waiter(0, klass=BATCH, min_share=0.1)
    realtime = waiter(1, klass=REALTIME)
    assert next_waiter([realtime, starved], {0: 0.02, 1: 0.98}) == starved
    assert next_waiter([realtime, starved], {0: 0.2, 1: 0.8}) == realtime
    assert next_waiter([], {}) is None


def replicas(
    tmp_path: Path,
    clock: Clock,
    *settings: TurnSettings,
    capacity: int = 1,
    pids: Collection[int],
    signal_to: Signal = send_signal,
) -> list[DeviceTurns]:
    """Several replicas on one table, each posing as its own pid."""
    out = []
    for i, s in enumerate(settings):
        turns = DeviceTurns(
            TurnTable(tmp_path / "dev.turns", capacity, 2.0),
            f"model-{i}",
            s,
            clock=clock,
            is_alive=lambda pid: pid in pids,
            signal_to=signal_to,
        )
        out.append(turns)
    return out


@pytest.fixture
def clock() -> Clock:
    return Clock()


def pose_as(turns: DeviceTurns, pid: int) -> None:
    """A replica of another process (one process runs them all here)."""
    with turns.table.locked() as table:
        for index in turns._slots:
            s = table.slot(index)
            s.pid = pid
            table.write(index, s)
    turns._pid = pid


def three(tmp_path: Path, clock: Clock, capacity: int = 1, **kw: TurnSettings) -> list[DeviceTurns]:
    pids = [101, 102, 103]
    made = replicas(
        tmp_path,
        clock,
        *(kw.get(f"s{i}", TurnSettings()) for i in range(3)),
        capacity=capacity,
        pids=pids,
    )
    for turns, pid in zip(made, pids, strict=True):
        pose_as(turns, pid)
    return made


def test_an_uncontended_turn_is_granted_at_once_and_a_second_waits(
    tmp_path: Path, clock: Clock
) -> None:
    a, b, _ = three(tmp_path, clock)
    turn_a, granted = a.try_acquire(BATCH)
    assert granted
    turn_b, granted = b.try_acquire(REALTIME)
    assert not granted
    clock.now += 0.05
    a.release(turn_a)
    assert b._granted_yet(turn_b)
    assert turn_b.waited_s == pytest.approx(0.05)
    assert b.counts.of(REALTIME).waited_turns == 1
    b.release(turn_b)


def test_release_grants_the_most_urgent_waiter_and_swapping_priority_swaps_the_order(
    tmp_path: Path, clock: Clock
) -> None:
    def order(priorities: tuple[int, int]) -> list[int]:
        holder, x, y = three(
            tmp_path,
            clock,
            s1=TurnSettings(priority=priorities[0]),
            s2=TurnSettings(priority=priorities[1]),
        )
        first, _ = holder.try_acquire(BATCH)
        tx, _ = x.try_acquire(BATCH)
        clock.now += 0.001
        ty, _ = y.try_acquire(BATCH)
        granted: list[int] = []
        holder.release(first)
        for _ in range(2):
            for i, (replica, turn) in enumerate(((x, tx), (y, ty))):
                if i + 1 not in granted and replica._granted_yet(turn):
                    granted.append(i + 1)
                    replica.release(turn)
                    break
        for replica in (holder, x, y):
            replica.close()
        return granted

    assert order((5, 1)) == [1, 2]
    assert order((1, 5)) == [2, 1]


def test_realtime_goes_before_a_batch_class_waiter_that_asked_earlier(
    tmp_path: Path, clock: Clock
) -> None:
    holder, bulk, live = three(tmp_path, clock)
    first, _ = holder.try_acquire(BATCH)
    t_bulk, _ = bulk.try_acquire(BATCH)
    clock.now += 0.5
    t_live, _ = live.try_acquire(REALTIME)
    holder.release(first)
    assert live._granted_yet(t_live)
    assert not bulk._granted_yet(t_bulk)


def test_a_waiting_turn_raised_to_a_higher_class_goes_before_those_it_passed(
    tmp_path: Path, clock: Clock
) -> None:
    """A batch-class pass that keeps its replica's realtime batch waiting behind it asks
    at realtime from then on: it goes before a normal-class pass of another model."""
    holder, bulk, other = three(tmp_path, clock)
    first, _ = holder.try_acquire(BATCH)
    t_bulk, _ = bulk.try_acquire(BATCH)
    t_other, _ = other.try_acquire(NORMAL)
    bulk._raise(t_bulk, REALTIME)
    bulk._raise(t_bulk, BATCH)  # never down again
    assert t_bulk.klass == REALTIME
    holder.release(first)
    assert bulk._granted_yet(t_bulk)
    assert not other._granted_yet(t_other)
    assert bulk.counts.of(REALTIME).turns == 1


def test_an_async_wait_asks_again_at_the_inherited_class_when_nudged(tmp_path: Path) -> None:
    a = DeviceTurns(TurnTable(tmp_path / "dev.turns", 1, 2.0), "a", TurnSettings())
    b = DeviceTurns(TurnTable(tmp_path / "dev.turns", 1, 2.0), "b", TurnSettings(recheck_s=5))
    c = DeviceTurns(TurnTable(tmp_path / "dev.turns", 1, 2.0), "c", TurnSettings(recheck_s=5))

    async def scenario() -> list[str]:
        behind: list[int] = []
        nudge = asyncio.Event()
        order: list[str] = []
        first = await a.acquire(BATCH)
        bulk = asyncio.create_task(
            b.acquire(BATCH, inherit=lambda: min(behind, default=None), nudge=nudge)
        )
        await asyncio.sleep(0.02)
        other = asyncio.create_task(c.acquire(NORMAL))
        await asyncio.sleep(0.02)
        behind.append(REALTIME)  # a realtime batch now waits behind b's pass
        nudge.set()
        await asyncio.sleep(0.02)
        a.release(first)
        for name, task, turns in (("b", bulk, b), ("c", other, c)):
            turn = await asyncio.wait_for(task, 2)
            order.append(name)
            turns.release(turn)
        return order

    assert asyncio.run(scenario()) == ["b", "c"]


def test_weights_share_the_capacity(tmp_path: Path, clock: Clock) -> None:
    """On a 4-unit device two 2-thread passes run together; a third waits."""
    two = TurnSettings(weight=2)
    a, b, c = three(tmp_path, clock, capacity=4, s0=two, s1=two, s2=two)
    assert a.try_acquire(NORMAL)[1]
    assert b.try_acquire(NORMAL)[1]
    assert not c.try_acquire(NORMAL)[1]


def test_a_pass_starts_while_a_unit_is_free_even_if_heavier_than_what_is_left(
    tmp_path: Path, clock: Clock
) -> None:
    """A one-thread step on one of two cores leaves a core free: a two-thread pass starts
    beside it rather than leave that core idle; a third waits while both cores are held."""
    a, b, c = three(
        tmp_path, clock, capacity=2, s0=TurnSettings(weight=1), s1=TurnSettings(weight=2)
    )
    assert a.try_acquire(BATCH)[1]
    assert b.try_acquire(BATCH)[1]
    assert not c.try_acquire(REALTIME)[1]


def test_a_pass_heavier_than_the_device_still_runs_alone(tmp_path: Path, clock: Clock) -> None:
    a, _, _ = three(tmp_path, clock, capacity=1, s0=TurnSettings(weight=8))
    assert a.try_acquire(NORMAL)[1]


def test_a_dead_holders_turn_is_taken_back(tmp_path: Path, clock: Clock) -> None:
    pids = [101, 102]
    a, b = replicas(tmp_path, clock, TurnSettings(), TurnSettings(), pids=pids)
    pose_as(a, 101)
    pose_as(b, 102)
    assert a.try_acquire(BATCH)[1]
    turn, granted = b.try_acquire(REALTIME)
    assert not granted
    pids.remove(101)  # the holder's process died
    assert b._granted_yet(turn)
    assert b.counts.taken_back == 1


def test_a_hung_holder_loses_its_turn_after_max_hold_s(tmp_path: Path, clock: Clock) -> None:
    a, b, _ = three(tmp_path, clock, s0=TurnSettings(max_hold_s=2.0))
    hung, _ = a.try_acquire(BATCH)
    turn, _ = b.try_acquire(REALTIME)
    clock.now += 1.0
    assert not b._granted_yet(turn)
    clock.now += 1.5
    assert b._granted_yet(turn)
    a.release(hung)  # late: it takes nothing from the new holder
    with b.table.locked() as table:
        assert table.slot(turn.slot).state == HOLDING


def test_a_holder_stopped_by_another_than_the_arbiter_loses_its_turn_within_a_second(
    tmp_path: Path, clock: Clock
) -> None:
    """A replica frozen mid-pass (SIGSTOP, a debugger) keeps the others waiting no longer
    than STOPPED_HOLDER_S, not max_hold_s; one the arbiter stopped for a realtime pass
    keeps its turn (its stopper continues it)."""
    stopped: set[int] = set()
    pids = [101, 102]
    signals: list[tuple[int, int]] = []
    a, b = replicas(
        tmp_path,
        clock,
        TurnSettings(),
        TurnSettings(),
        pids=pids,
        signal_to=lambda pid, sig: signals.append((pid, sig)),
    )
    for turns, pid in ((a, 101), (b, 102)):
        pose_as(turns, pid)
        turns._stopped = lambda pid: pid in stopped
    frozen, _ = a.try_acquire(BATCH)
    turn, _ = b.try_acquire(NORMAL)
    stopped.add(101)
    clock.now += STOPPED_HOLDER_S * 0.8
    assert not b._granted_yet(turn)  # a moment's stop: the pass may go on
    with a.table.locked() as table:  # the arbiter's own stop, shorter than MAX_PAUSE_S
        slot = table.slot(frozen.slot)
        slot.paused_by, slot.paused_at = 102, clock.now
        table.write(frozen.slot, slot)
    clock.now += STOPPED_HOLDER_S * 0.4
    assert not b._granted_yet(turn)
    assert signals == []
    with a.table.locked() as table:
        slot = table.slot(frozen.slot)
        slot.paused_by = 0
        table.write(frozen.slot, slot)
    assert b._granted_yet(turn)
    assert b.counts.taken_back == 1


def test_a_process_stopped_by_a_signal_reads_as_stopped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not pid_stopped(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not pid_stopped(child.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGCONT)
    finally:
        child.kill()
        child.wait()
    assert not pid_stopped(child.pid)  # gone


def test_withdrawing_a_granted_turn_passes_it_on(tmp_path: Path, clock: Clock) -> None:
    a, b, c = three(tmp_path, clock)
    first, _ = a.try_acquire(BATCH)
    gone, _ = b.try_acquire(REALTIME)
    waiting, _ = c.try_acquire(BATCH)
    a.release(first)  # granted to b, whose caller is gone
    b.withdraw(gone)
    assert c._granted_yet(waiting)


def bulk_share_beside_a_realtime_stream(tmp_path: Path, clock: Clock, min_share: float) -> float:
    """A realtime model that always has its next pass waiting (two passes asked at once)
    beside a batch-class model with `min_share`: the batch model's share of the time."""
    pids = [101, 102]
    live = DeviceTurns(
        TurnTable(tmp_path / "dev.turns", 1, 2.0),
        "live",
        TurnSettings(),
        passes=2,
        clock=clock,
        is_alive=lambda pid: pid in pids,
    )
    (bulk,) = replicas(tmp_path, clock, TurnSettings(min_share=min_share), pids=pids)
    pose_as(live, 101)
    pose_as(bulk, 102)
    held = {"live": 0.0, "bulk": 0.0}
    live_turns = [live.try_acquire(REALTIME)[0], live.try_acquire(REALTIME)[0]]
    bulk_turn, _ = bulk.try_acquire(BATCH)
    for _ in range(500):
        clock.now += 0.01
        for turn in list(live_turns):
            if live._granted_yet(turn):
                live.release(turn)
                held["live"] += 0.01
                live_turns.remove(turn)
                live_turns.append(live.try_acquire(REALTIME)[0])
                break
        else:
            assert bulk._granted_yet(bulk_turn)
            bulk.release(bulk_turn)
            held["bulk"] += 0.01
            bulk_turn, _ = bulk.try_acquire(BATCH)
    assert bulk.my_share() == pytest.approx(min_share, abs=0.08)
    return held["bulk"] / (held["live"] + held["bulk"])


def test_min_share_lets_a_low_class_model_through_a_realtime_stream(
    tmp_path: Path, clock: Clock
) -> None:
    assert 0.15 <= bulk_share_beside_a_realtime_stream(tmp_path, clock, 0.2) <= 0.3


def test_without_min_share_realtime_keeps_the_device(tmp_path: Path, clock: Clock) -> None:
    assert bulk_share_beside_a_realtime_stream(tmp_path, clock, 0.0) == 0.0


def test_the_async_wait_wakes_on_release(tmp_path: Path) -> None:
    a = DeviceTurns(TurnTable(tmp_path / "dev.turns", 1, 2.0), "a", TurnSettings())
    b = DeviceTurns(TurnTable(tmp_path / "dev.turns", 1, 2.0), "b", TurnSettings(recheck_s=5))

    async def scenario() -> float:
        first = await a.acquire(BATCH)
        waiter = asyncio.create_task(b.acquire(REALTIME))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        released = time.monotonic()
        a.release(first)
        turn = await asyncio.wait_for(waiter, 2)
        woke = time.monotonic() - released
        b.release(turn)
        return woke

    # Woken by the datagram, long before the 5 s recheck.
    assert asyncio.run(scenario()) < 1.0


def test_a_cancelled_async_wait_leaves_no_turn_behind(tmp_path: Path) -> None:
    a = DeviceTurns(TurnTable(tmp_path / "dev.turns", 1, 2.0), "a", TurnSettings())
    b = DeviceTurns(TurnTable(tmp_path / "dev.turns", 1, 2.0), "b", TurnSettings())

    async def scenario() -> None:
        first = await a.acquire(BATCH)
        waiter = asyncio.create_task(b.acquire(REALTIME))
        await asyncio.sleep(0.02)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        a.release(first)
        again = await asyncio.wait_for(a.acquire(BATCH), 1)
        a.release(again)

    asyncio.run(scenario())
    assert b.report()["waiting"] == 0


def test_a_table_of_another_layout_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "dev.turns"
    path.write_bytes(b"not a table" * 10)
    turns = DeviceTurns(TurnTable(path, 1, 2.0), "a", TurnSettings())
    turn, granted = turns.try_acquire(NORMAL)
    assert granted
    turns.release(turn)


# Real processes: one table, capacity 1, each process records when it held the turn.


def _contender(path: str, name: str, klass: int, rounds: int, log: str) -> None:
    turns = DeviceTurns(TurnTable(Path(path), 1, 2.0), name, TurnSettings(recheck_s=0.05))
    with open(log, "a") as out:
        for _ in range(rounds):
            turn = turns.acquire_blocking(klass)
            start = time.monotonic()
            time.sleep(0.002)
            end = time.monotonic()
            turns.release(turn)
            out.write(f"{start} {end}\n")
            out.flush()
    turns.close()


def test_processes_never_hold_a_one_pass_device_at_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    log = tmp_path / "held.log"
    procs = [
        ctx.Process(
            target=_contender, args=(str(tmp_path / "dev.turns"), f"m{i}", i % 3, 40, str(log))
        )
        for i in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(spans) == 120
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two processes held the device at once"


def _holder(path: str, ready: str) -> None:
    turns = DeviceTurns(TurnTable(Path(path), 1, 2.0), "holder", TurnSettings())
    turns.acquire_blocking(BATCH)
    Path(ready).write_text("held")
    time.sleep(60)


def test_a_killed_holder_frees_the_device_within_the_recheck(tmp_path: Path) -> None:
    path, ready = tmp_path / "dev.turns", tmp_path / "ready"
    proc = multiprocessing.get_context("spawn").Process(
        target=_holder, args=(str(path), str(ready))
    )
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline, "the holder never took its turn"
            time.sleep(0.01)
        waiter = DeviceTurns(TurnTable(path, 1, 2.0), "w", TurnSettings(recheck_s=0.05))
        turn, granted = waiter.try_acquire(REALTIME)
        assert not granted
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        started = time.monotonic()
        while not waiter._granted_yet(turn):
            time.sleep(0.01)
            assert time.monotonic() - started < 2
        waiter.release(turn)
    finally:
        proc.kill()


def test_a_replica_keeps_the_device_for_its_next_pass_only_when_that_ranks_first(
    tmp_path: Path, clock: Clock
) -> None:
    favoured, other, live = three(tmp_path, clock, s0=TurnSettings(priority=10))
    turn, _ = favoured.try_acquire(BATCH)
    waiting, _ = other.try_acquire(BATCH)
    clock.now += 0.01
    # Its next batch outranks the waiting one (higher model priority): kept.
    assert favoured.keep(turn, BATCH, math.inf, lease_s=0.05)
    assert favoured.take_up(turn, BATCH)
    assert not other._granted_yet(waiting)
    # A realtime pass now waits: the next batch-class pass does not keep the device.
    urgent, _ = live.try_acquire(REALTIME)
    clock.now += 0.01
    assert not favoured.keep(turn, BATCH, math.inf, lease_s=0.05)
    assert live._granted_yet(urgent)
    assert favoured.counts.of(BATCH).turns == 2


def test_equals_take_turns_first_come_and_a_far_deadline_is_no_urgency(
    tmp_path: Path, clock: Clock
) -> None:
    """Same class and priority: the one already waiting goes next, even if the holder's
    next batch has a deadline minutes away (the clock counts only when it is near)."""
    holder, waiter, _ = three(tmp_path, clock)
    turn, _ = holder.try_acquire(BATCH)
    waiting, _ = waiter.try_acquire(BATCH)
    clock.now += 0.01
    assert not holder.keep(turn, BATCH, clock.now + 600, lease_s=0.05)
    assert waiter._granted_yet(waiting)


def test_a_kept_turn_not_taken_up_within_its_lease_is_taken_back(
    tmp_path: Path, clock: Clock
) -> None:
    favoured, other, _ = three(tmp_path, clock, s0=TurnSettings(priority=10))
    turn, _ = favoured.try_acquire(BATCH)
    waiting, _ = other.try_acquire(BATCH)
    assert favoured.keep(turn, BATCH, math.inf, lease_s=0.05)
    clock.now += 0.03
    assert not other._granted_yet(waiting)
    clock.now += 0.05  # the favoured replica's next pass never came
    assert other._granted_yet(waiting)
    # Its pass comes now, too late: it is not run beside the new holder but asks again.
    assert not favoured.take_up(turn, BATCH)
    again, granted = favoured.try_acquire(BATCH)
    assert not granted
    other.release(waiting)
    assert favoured._granted_yet(again)


def test_a_turn_taken_back_before_its_pass_ended_is_not_kept(tmp_path: Path, clock: Clock) -> None:
    slow, other, _ = three(tmp_path, clock, s0=TurnSettings(priority=10, max_hold_s=1.0))
    turn, _ = slow.try_acquire(BATCH)
    waiting, _ = other.try_acquire(BATCH)
    clock.now += 2.0
    assert other._granted_yet(waiting)  # the slow pass held past max_hold_s
    assert not slow.keep(turn, BATCH, math.inf, lease_s=0.05)
    with other.table.locked() as table:
        assert table.slot(waiting.slot).state == HOLDING
