"""A realtime pass stops other models' lower passes while it runs (core/device_turns/
pause.py): who is stopped and who is not, what the table grants meanwhile, and how a stop
left behind by a stopper that died or overran is undone; with fake pids and signals, then
with a real process stopped and continued."""

from __future__ import annotations

import multiprocessing
import signal
import time
from pathlib import Path

import pytest

from deployments.core.device_turns.pause import MAX_PAUSE_S
from deployments.core.device_turns.table import TurnTable
from deployments.core.device_turns.turns import DeviceTurns, TurnSettings
from deployments.core.priority import Priority
from deployments.replicas.device_turns import ReplicaTurns
from tests.unit.test_device_turns import BATCH, NORMAL, REALTIME, Clock, pose_as
from tests.unit.test_device_turns import replicas as base_replicas


class Signals:
    """Records the signals a replica would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []

    def __call__(self, pid: int, sig: int) -> None:
        self.sent.append((pid, sig))

    def of(self, sig: int) -> list[int]:
        return [pid for pid, s in self.sent if s == sig]


def replicas(
    tmp_path: Path,
    clock: Clock,
    signals: Signals,
    *settings: TurnSettings,
    capacity: int = 2,
    alive: set[int] | None = None,
) -> list[DeviceTurns]:
    """Replicas on one table, the n-th posing as pid 101 + n."""
    pids = [101 + i for i in range(len(settings))]
    living = alive if alive is not None else set(pids)
    made = base_replicas(
        tmp_path, clock, *settings, capacity=capacity, pids=living, signal_to=signals
    )
    for turns, pid in zip(made, pids, strict=True):
        pose_as(turns, pid)
    return made


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def signals() -> Signals:
    return Signals()


def test_a_realtime_pass_stops_lower_holders_of_other_processes_and_continues_them(
    tmp_path: Path, clock: Clock, signals: Signals
) -> None:
    s = TurnSettings(min_share=0.0)
    bulk, steady, live, _ = replicas(tmp_path, clock, signals, s, s, s, s, capacity=3)
    t_bulk, _ = bulk.try_acquire(BATCH)
    t_steady, _ = steady.try_acquire(REALTIME)
    t_live, _ = live.try_acquire(NORMAL)
    paused = live.pause_lower(REALTIME)
    # The batch holder is stopped; a realtime holder is not, nor the stopper itself.
    assert signals.of(signal.SIGSTOP) == [101]
    assert live.counts.paused == 1
    clock.now += 0.01
    live.resume(paused)
    assert signals.of(signal.SIGCONT) == [101]
    assert live.counts.paused_s == pytest.approx(0.01)
    # A lower pass never stops anyone.
    assert bulk.pause_lower(BATCH).slots == []
    for turns, turn in ((bulk, t_bulk), (steady, t_steady), (live, t_live)):
        turns.release(turn)


def test_a_model_owed_its_min_share_is_not_stopped(
    tmp_path: Path, clock: Clock, signals: Signals
) -> None:
    bulk, live = replicas(tmp_path, clock, signals, TurnSettings(min_share=0.3), TurnSettings())
    # The live model held the device for 9 s of the last 10: bulk is below its 0.3.
    t, _ = live.try_acquire(REALTIME)
    clock.now += 9.0
    live.release(t)
    t, _ = bulk.try_acquire(BATCH)
    clock.now += 1.0
    bulk.release(t)
    t_bulk, _ = bulk.try_acquire(BATCH)
    paused = live.pause_lower(REALTIME)
    assert paused.slots == [] and signals.sent == []
    bulk.release(t_bulk)


def test_while_a_holder_is_stopped_only_realtime_passes_are_granted(
    tmp_path: Path, clock: Clock, signals: Signals
) -> None:
    s = TurnSettings()
    bulk, waiting, live = replicas(tmp_path, clock, signals, s, s, s, capacity=2)
    t_bulk, _ = bulk.try_acquire(BATCH)
    paused = live.pause_lower(REALTIME)
    # Room for a second pass, but the cores the stop freed are for the realtime one.
    t_waiting, granted = waiting.try_acquire(BATCH)
    assert not granted
    t_live, granted = live.try_acquire(REALTIME)
    assert granted
    live.release(t_live)
    live.resume(paused)
    bulk.release(t_bulk)
    assert waiting._granted_yet(t_waiting)
    waiting.release(t_waiting)


def test_a_stop_whose_stopper_died_or_overran_is_undone_by_the_next_look(
    tmp_path: Path, clock: Clock, signals: Signals
) -> None:
    s = TurnSettings()
    alive = {101, 102, 103}
    bulk, stopper, waiter = replicas(tmp_path, clock, signals, s, s, s, capacity=2, alive=alive)
    t_bulk, _ = bulk.try_acquire(BATCH)
    stopper.pause_lower(REALTIME)
    t_wait, granted = waiter.try_acquire(BATCH)
    assert not granted and signals.of(signal.SIGCONT) == []
    # Overran: the next look at the table after MAX_PAUSE_S continues the holder.
    clock.now += MAX_PAUSE_S + 0.01
    assert waiter._granted_yet(t_wait)
    assert signals.of(signal.SIGCONT) == [101]
    assert waiter.counts.continued_stale == 1
    waiter.release(t_wait)
    # Died: continued at once, whatever the time.
    signals.sent.clear()
    stopper.pause_lower(REALTIME)
    t_wait, granted = waiter.try_acquire(BATCH)
    assert not granted
    alive.discard(102)
    assert waiter._granted_yet(t_wait)
    assert signals.of(signal.SIGCONT) == [101]
    waiter.release(t_wait)
    bulk.release(t_bulk)


def test_a_holder_that_runs_on_until_its_stop_lands_is_still_continued(
    tmp_path: Path, clock: Clock, signals: Signals
) -> None:
    """The stop is sent under the lock, but on a loaded machine the stopped process may run
    for milliseconds more: it ends its pass and asks for the next turn, rewriting its slot,
    and only then stops. The stopper must continue it all the same: left stopped while
    holding the table's lock, it would stop every replica on the device (the likeliest
    cause of a soak's three model replicas missing their health checks at once)."""
    s = TurnSettings(min_share=0.0)
    bulk, live = replicas(tmp_path, clock, signals, s, s, capacity=2)
    t_bulk, _ = bulk.try_acquire(BATCH)
    paused = live.pause_lower(REALTIME)
    assert signals.of(signal.SIGSTOP) == [101]
    # Not stopped yet: the pass ends and the next one asks, on the same slot.
    bulk.release(t_bulk)
    t_next, _ = bulk.try_acquire(BATCH)
    assert t_next.slot == t_bulk.slot
    clock.now += 0.01
    live.resume(paused)
    assert signals.of(signal.SIGCONT) == [101]
    # The mark is cleared with the resume: the next pass is granted as any other.
    assert bulk._granted_yet(t_next)
    bulk.release(t_next)


def test_the_stopper_continues_what_it_stopped_even_when_the_table_lost_the_mark(
    tmp_path: Path, clock: Clock, signals: Signals
) -> None:
    s = TurnSettings(min_share=0.0)
    bulk, live = replicas(tmp_path, clock, signals, s, s, capacity=2)
    t_bulk, _ = bulk.try_acquire(BATCH)
    paused = live.pause_lower(REALTIME)
    with live.table.locked() as table:
        slot = table.slot(t_bulk.slot)
        slot.paused_by, slot.paused_at = 0, 0.0
        table.write(t_bulk.slot, slot)
    live.resume(paused)
    assert signals.of(signal.SIGCONT) == [101]
    bulk.release(t_bulk)


def test_a_process_holding_two_turns_is_stopped_once_and_continued_once(
    tmp_path: Path, clock: Clock, signals: Signals
) -> None:
    table = TurnTable(tmp_path / "dev.turns", 4, 2.0)
    bulk = DeviceTurns(table, "bulk", TurnSettings(), passes=2, clock=clock, signal_to=signals)
    for _ in range(2):
        bulk.try_acquire(BATCH)
    [a, _] = replicas(tmp_path, clock, signals, TurnSettings(), TurnSettings(), capacity=4)
    # Pose the bulk replica as pid 200, the two stoppers as 101 and 102.
    with table.locked() as t:
        for index in bulk._slots:
            slot = t.slot(index)
            slot.pid = 200
            t.write(index, slot)
    paused_a = a.pause_lower(REALTIME)
    assert signals.of(signal.SIGSTOP) == [200] and len(paused_a.slots) == 2
    a.resume(paused_a)
    assert signals.of(signal.SIGCONT) == [200]


def test_first_on_the_cores_stops_only_for_realtime_and_only_when_asked(
    tmp_path: Path, clock: Clock, signals: Signals
) -> None:
    from deployments.core.metrics.metrics import TributaryMetrics

    bulk, live = replicas(tmp_path, clock, signals, TurnSettings(), TurnSettings())
    t_bulk, _ = bulk.try_acquire(BATCH)
    metrics = TributaryMetrics()
    on, off = ReplicaTurns(live, metrics, pause_for_realtime=True), ReplicaTurns(live, metrics)
    with on.first_on_the_cores(Priority.NORMAL), off.first_on_the_cores(Priority.REALTIME):
        pass
    assert signals.sent == []
    with on.first_on_the_cores(Priority.REALTIME):
        assert signals.of(signal.SIGSTOP) == [101]
    assert signals.of(signal.SIGCONT) == [101]
    bulk.release(t_bulk)


# A real process: stopped while a realtime pass of this one runs, and continued after.


def _busy_holder(path: str, counter: str) -> None:
    turns = DeviceTurns(TurnTable(Path(path), 2, 2.0), "bulk", TurnSettings(min_share=0.0))
    turns.acquire_blocking(BATCH)
    n = 0
    while True:
        n += 1
        if n % 1000 == 0:
            Path(counter).write_text(str(n))


def _count(counter: Path) -> int:
    try:
        return int(counter.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def test_a_real_holder_is_stopped_for_the_realtime_pass_and_goes_on_after(
    tmp_path: Path,
) -> None:
    path, counter = tmp_path / "dev.turns", tmp_path / "count"
    proc = multiprocessing.get_context("spawn").Process(
        target=_busy_holder, args=(str(path), str(counter))
    )
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while _count(counter) == 0:
            assert time.monotonic() < deadline, "the holder never started"
            time.sleep(0.01)
        live = DeviceTurns(TurnTable(path, 2, 2.0), "live", TurnSettings())
        paused = live.pause_lower(REALTIME)
        assert len(paused.slots) == 1
        time.sleep(0.1)  # the stop lands
        stopped_at = _count(counter)
        time.sleep(0.2)
        assert _count(counter) == stopped_at, "the holder ran while stopped"
        live.resume(paused)
        deadline = time.monotonic() + 10
        while _count(counter) == stopped_at:
            assert time.monotonic() < deadline, "the holder was never continued"
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.join(10)


# A stop lands a moment after it is sent: the stopped process may have taken the table's
# lock in between. Nobody may wait on that lock for ever.


def _churn(path: str, seconds: float, done: str) -> None:
    """Takes and gives back batch-class turns as fast as it can, for `seconds`."""
    turns = DeviceTurns(TurnTable(Path(path), 4, 2.0), "churn", TurnSettings(min_share=0.0))
    rounds = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        turn, granted = turns.try_acquire(BATCH)
        if granted:
            turns.release(turn)
        else:
            turns.withdraw(turn)
        rounds += 1
    Path(done).write_text(str(rounds))


def test_stops_that_land_inside_the_lock_never_deadlock_the_device(tmp_path: Path) -> None:
    """Before the table's lock gave up waiting on a stopped holder, this hung within a
    second: the churner stopped inside the lock, and this process waiting for it."""
    path, done = tmp_path / "dev.turns", tmp_path / "done"
    holder = DeviceTurns(TurnTable(path, 4, 2.0), "holder", TurnSettings(min_share=0.0))
    proc = multiprocessing.get_context("spawn").Process(
        target=_churn, args=(str(path), 2.0, str(done))
    )
    proc.start()
    try:
        live = DeviceTurns(TurnTable(path, 4, 2.0), "live", TurnSettings())
        deadline = time.monotonic() + 120
        pauses = 0
        while not done.exists():
            assert time.monotonic() < deadline, "the churning process never finished"
            # Pose as a realtime pass of a third process: stop every lower holder (the
            # churner, whenever it holds a turn), then continue it.
            paused = live.pause_lower(REALTIME)
            pauses += bool(paused.slots)
            live.resume(paused)
            time.sleep(0.0002)
        proc.join(30)
        assert proc.exitcode == 0
        assert pauses > 0 and int(done.read_text()) > 0
    finally:
        proc.kill()
        proc.join(10)
        holder.close()
