"""Realtime before everyone, on a CPU: a realtime pass stops, for as long as it runs, the
other processes on its device that hold a turn for a lower class, and lets them go on after.

A turn decides only who *starts* next: a batch-class pass that started a moment before a
realtime request came keeps every core it has until it ends, and the realtime pass runs
beside it at half speed or worse (on two cores, three models: its p99 under a flood was 2-4x
its idle one, docs/benchmarks.md). Nothing inside a pass can be told to yield (ONNX Runtime
and OpenVINO run a graph as one call), but its process can be stopped (SIGSTOP) and
continued (SIGCONT): the pass resumes where it was, later by the realtime pass's length.

Safety. The stop is sent with the table's lock held, but lands a moment later, and in that
moment the stopped process may take the lock: whoever then waits for the lock past a few
milliseconds continues it (table.py, `_take_file_lock`). Every stop is written into the
stopped holder's slot (by whom, since when); the one that stopped it continues it when its
pass ends, and anyone who looks at the table for a turn continues a holder whose stopper
died or that was stopped longer than `MAX_PAUSE_S` (a pass that hangs), so no process is
left stopped by a failure of another. A model below its `min_share` is not stopped: the
ageing that keeps a low class moving still holds.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Collection, Mapping

from deployments.core.device_turns.table import (
    FREE,
    HOLDING,
    KLASS,
    MIN_SHARE,
    MODEL_KEY,
    PAUSED_AT,
    PAUSED_BY,
    PID,
    STATE,
    TurnTable,
    send_signal,
    stopped_pids,
)

REALTIME = 0  # the class's value (core/priority.Priority)

# The longest a holder stays stopped for one realtime pass; past it, anyone continues it.
MAX_PAUSE_S = 0.5

Signal = Callable[[int, int], None]


def pause_lower(
    table: TurnTable,
    me: int,
    klass: int,
    now: float,
    shares: Callable[[], Mapping[int, float]],
    signal_to: Signal = send_signal,
) -> list[int]:
    """Under the lock: stops every other process holding a turn of a class below `klass`
    (a larger number) whose model is not owed its min_share; returns the slots stopped.
    `shares` is read only where a holder has a min_share to weigh."""
    paused: list[int] = []
    stopped: set[int] = set()
    for index, row in enumerate(table.rows(table.header().high_water)):
        pid = int(row[PID])
        if row[STATE] != HOLDING or pid == me or row[KLASS] <= klass or row[PAUSED_BY]:
            continue
        min_share = row[MIN_SHARE]
        if min_share > 0 and shares().get(int(row[MODEL_KEY]), 0.0) < min_share:
            continue
        slot = table.slot(index)
        slot.paused_by, slot.paused_at = me, now
        table.write(index, slot)
        if pid not in stopped:
            signal_to(pid, signal.SIGSTOP)
            stopped.add(pid)
        paused.append(index)
    return paused


def resume(
    table: TurnTable,
    me: int,
    slots: list[int],
    stopped: Collection[int] = (),
    signal_to: Signal = send_signal,
) -> None:
    """Under the lock: clears `me`'s marks in `slots` (a slot another stopper took over, or
    that changed hands, is left alone) and continues the processes `me` stopped, `stopped`,
    unless another live stop still holds them. `stopped` is what the stopper remembers,
    not what the slots say: a slot's mark can be gone by the time the stop lands (a
    process may run on for a moment after the signal is sent), and a process left stopped
    while it holds the table's lock would stop every replica on the device."""
    pids: set[int] = set(stopped)
    for index in slots:
        slot = table.slot(index)
        if slot.paused_by != me:
            continue
        pids.add(slot.pid)
        slot.paused_by, slot.paused_at = 0, 0.0
        table.write(index, slot)
    _continue(table, pids, signal_to)


def resume_stale(
    table: TurnTable,
    now: float,
    is_alive: Callable[[int], bool],
    max_pause_s: float = MAX_PAUSE_S,
    signal_to: Signal = send_signal,
) -> int:
    """Under the lock: continues every holder whose stopper is gone or that has been
    stopped longer than `max_pause_s`; returns how many slots were freed of their stop."""
    pids: set[int] = set()
    for index, row in enumerate(table.rows(table.header().high_water)):
        by = int(row[PAUSED_BY])
        if not by or row[STATE] == FREE:
            continue
        if now - row[PAUSED_AT] <= max_pause_s and is_alive(by):
            continue
        slot = table.slot(index)
        pids.add(slot.pid)
        slot.paused_by, slot.paused_at = 0, 0.0
        table.write(index, slot)
    _continue(table, pids, signal_to)
    return len(pids)


def _continue(table: TurnTable, pids: set[int], signal_to: Signal) -> None:
    """SIGCONT to each pid none of whose slots another live stop still holds."""
    if not pids:
        return
    still = stopped_pids(table.rows(table.header().high_water))
    for pid in pids - still:
        signal_to(pid, signal.SIGCONT)
