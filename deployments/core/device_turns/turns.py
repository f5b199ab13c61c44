"""A replica's turns at its device: ask before a forward pass (or an engine step), give
back after. The most urgent waiting pass on the device is granted next (`order.py`), as
soon as the passes holding turns leave a unit of `capacity` free (units of `weight`).

The uncontended turn is one locked look at the shared table (`table.py`): a few
microseconds. A pass that must wait sleeps on a datagram socket of its own slot; whoever
gives a turn back grants the next one under the lock and sends it one byte. A waiter also
looks again every `recheck_s`, so a lost byte or a holder that died costs at most that.

Both waits are offered: `acquire` on an event loop, `acquire_blocking` on a thread (the
generation engine's step runs on its own thread).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import select
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from deployments.core.device_turns.order import Waiter, next_waiter, urgency
from deployments.core.device_turns.pause import (
    REALTIME,
    Signal,
    pause_lower,
    resume,
    resume_stale,
)
from deployments.core.device_turns.table import (
    FREE,
    GRANTED_AT,
    HOLDING,
    IDLE,
    KLASS,
    MAX_HOLD_S,
    MIN_SHARE,
    MODEL_KEY,
    PAUSED_BY,
    PID,
    PRIORITY,
    SINCE,
    STATE,
    URGENT_AT,
    WAITING,
    WEIGHT,
    Header,
    Slot,
    TurnTable,
    decayed,
    send_signal,
)

Clock = Callable[[], float]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive, if not ours to signal
        return True
    return True


def pid_stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal or a tracer (state T or t in /proc); False
    where it cannot be read (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return bool(fields) and fields[0] in (b"T", b"t")


# A holder that has held its turn this long and is found stopped, by no stop of the
# arbiter's own (pause.py), loses it: a process frozen mid-pass (SIGSTOP, a debugger)
# would otherwise keep every model on the device waiting for `max_hold_s` (30 s). Losing a
# turn costs only the device's exclusivity, so the bound need not be safe, only rare.
STOPPED_HOLDER_S = 1.0


@dataclass(frozen=True)
class TurnSettings:
    priority: int = 0  # the model's, across models; higher goes first
    min_share: float = 0.0  # of the device's recent busy time, guaranteed while it waits
    weight: int = 1  # capacity units one pass holds
    max_hold_s: float = 30.0  # a turn held longer is taken back (a hung pass)
    recheck_s: float = 0.1  # a waiter looks at the table at least this often


@dataclass
class Turn:
    """One granted turn; `waited_s` from asking to the grant."""

    slot: int
    klass: int
    asked_at: float
    granted_at: float = 0.0

    @property
    def waited_s(self) -> float:
        return self.granted_at - self.asked_at


class Stop(NamedTuple):
    """What a realtime pass stopped (`DeviceTurns.pause_lower`), for `resume`."""

    slots: list[int]
    since: float
    pids: frozenset[int] = frozenset()


@dataclass
class ClassCounts:
    turns: int = 0
    waited_s: float = 0.0
    held_s: float = 0.0
    waited_turns: int = 0  # turns that had to wait


@dataclass
class TurnCounts:
    by_class: dict[int, ClassCounts] = field(default_factory=dict)
    taken_back: int = 0  # turns of others this replica found dead or hung and freed
    paused: int = 0  # holders of lower classes this replica stopped for a realtime pass
    paused_s: float = 0.0  # how long those realtime passes kept them stopped, in all
    continued_stale: int = 0  # stopped holders whose stopper died or overran, continued

    def of(self, klass: int) -> ClassCounts:
        return self.by_class.setdefault(klass, ClassCounts())


class DeviceTurns:
    def __init__(
        self,
        table: TurnTable,
        model: str,
        settings: TurnSettings,
        passes: int = 1,
        clock: Clock = time.monotonic,
        is_alive: Callable[[int], bool] = pid_alive,
        signal_to: Signal = send_signal,
        is_stopped: Callable[[int], bool] = pid_stopped,
    ) -> None:
        """`passes`: how many turns this replica may hold or ask for at once; `signal_to`:
        how a holder is stopped and continued for a realtime pass (`pause.py`)."""
        self._stopped = is_stopped
        self.table = table
        self.model = model
        self.settings = settings
        self.counts = TurnCounts()
        self._clock = clock
        self._alive = is_alive
        self._signal = signal_to
        self._pid = os.getpid()
        self._model_key = zlib.crc32(model.encode())
        with table.locked():
            self._slots = [table.claim(self._pid, is_alive) for _ in range(max(1, passes))]
        self._idle = deque(self._slots)
        self._idle_lock = threading.Lock()
        self._wakers = {index: self._bind(index) for index in self._slots}
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sender.setblocking(False)

    def _socket_path(self, index: int) -> str:
        return f"{self.table.path}.{index}.sock"

    def _bind(self, index: int) -> socket.socket:
        path = self._socket_path(index)
        with suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.setblocking(False)
        return sock

    # Asking and giving back.

    def try_acquire(self, klass: int, urgent_at: float = math.inf) -> tuple[Turn, bool]:
        """Asks for a turn without waiting: (the turn, whether it is granted). A turn not
        granted is waiting in the table; finish with `acquire`'s or `acquire_blocking`'s
        wait, or `withdraw` it."""
        with self._idle_lock:
            index = self._idle.popleft()
        now = self._clock()
        turn = Turn(index, klass, now)
        s = self.settings
        with self.table.locked() as table:
            last = table.slot(index)
            table.write(
                index,
                Slot(
                    pid=self._pid,
                    state=WAITING,
                    klass=klass,
                    priority=s.priority,
                    weight=s.weight,
                    min_share=s.min_share,
                    since=now,
                    urgent_at=urgent_at,
                    max_hold_s=s.max_hold_s,
                    model_key=self._model_key,
                    busy=last.busy,
                    busy_at=last.busy_at,
                    # A stop sent while this process held the slot may land only now
                    # (pause.py): its mark stays for the stopper's `resume` to find.
                    paused_by=last.paused_by,
                    paused_at=last.paused_at,
                ),
            )
            granted = self._fill(table, now, reap=False)
            if index not in granted:
                granted += self._fill(table, now, reap=True)
        self._wake(granted, besides=index)
        if index in granted:
            turn.granted_at = now
            self._note_granted(turn)
            return turn, True
        return turn, False

    async def acquire(
        self,
        klass: int,
        urgent_at: float = math.inf,
        inherit: Callable[[], int | None] | None = None,
        nudge: asyncio.Event | None = None,
    ) -> Turn:
        """A turn, waited for on the running event loop. `inherit`: the class of the most
        urgent work this pass keeps waiting in its replica (asked again whenever `nudge`
        is set, and at every look at the table); the turn waits at that class where it
        is higher, so a batch-class pass that holds its replica's only slot does not keep
        a realtime batch behind it waiting at the batch class's place on the device."""
        if inherit is not None:
            klass = min(klass, _or(inherit(), klass))
        turn, granted = self.try_acquire(klass, urgent_at)
        if granted:
            return turn
        loop = asyncio.get_running_loop()
        sock = self._wakers[turn.slot]
        woken = nudge or asyncio.Event()
        loop.add_reader(sock.fileno(), woken.set)
        try:
            while not self._granted_yet(turn):
                with suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), self.settings.recheck_s)
                woken.clear()
                _drain(sock)
                if inherit is not None:
                    self._raise(turn, _or(inherit(), turn.klass))
        except BaseException:
            self.withdraw(turn)
            raise
        finally:
            loop.remove_reader(sock.fileno())
        return turn

    def _raise(self, turn: Turn, klass: int) -> None:
        """A waiting turn moves up to `klass` (never down) and may be granted at once."""
        if klass >= turn.klass:
            return
        now = self._clock()
        with self.table.locked() as table:
            mine = table.slot(turn.slot)
            if mine.pid != self._pid or mine.state != WAITING:
                return  # granted meanwhile: the next look at the table finds it
            mine.klass = klass
            table.write(turn.slot, mine)
            granted = self._fill(table, now, reap=False)
        turn.klass = klass
        self._wake(granted, besides=turn.slot)

    def acquire_blocking(self, klass: int, urgent_at: float = math.inf) -> Turn:
        """A turn, waited for on this thread."""
        turn, granted = self.try_acquire(klass, urgent_at)
        if granted:
            return turn
        sock = self._wakers[turn.slot]
        try:
            while not self._granted_yet(turn):
                select.select([sock], [], [], self.settings.recheck_s)
                _drain(sock)
        except BaseException:
            self.withdraw(turn)
            raise
        return turn

    def release(self, turn: Turn) -> None:
        """Gives the turn back; the next waiting pass is granted at once."""
        now = self._clock()
        held_s = max(0.0, now - turn.granted_at)
        with self.table.locked() as table:
            mine = table.slot(turn.slot)
            if mine.pid == self._pid and mine.state in (HOLDING, WAITING):
                mine.state = IDLE
            self._add_busy(table, turn.slot, mine, held_s, now)
            granted = self._fill(table, now, reap=False)
        self._wake(granted)
        self.counts.of(turn.klass).held_s += held_s
        self._give_back_slot(turn.slot)

    def keep(self, turn: Turn, klass: int, urgent_at: float, lease_s: float) -> bool:
        """At the end of a pass whose replica has its next pass ready: keeps the device for
        that pass when it ranks before every waiting one (else gives the turn back, as
        `release`, and returns False). Giving back and asking again would hand the device
        to whoever waits, however less urgent, since the next pass asks only after this
        one ends. A kept turn must be taken up (`take_up`) within `lease_s`, or waiters
        take it back."""
        now = self._clock()
        held_s = max(0.0, now - turn.granted_at)
        s = self.settings
        granted: list[int] = []
        with self.table.locked() as table:
            mine = table.slot(turn.slot)
            self._add_busy(table, turn.slot, mine, held_s, now)
            if mine.pid != self._pid or mine.state != HOLDING:
                kept = False  # taken back meanwhile (held past max_hold_s): as `release`
            else:
                me = Waiter(
                    turn.slot,
                    self._model_key,
                    klass,
                    s.priority,
                    urgency(urgent_at, now),
                    now,
                    s.min_share,
                    s.weight,
                )
                others = self._waiting(table, now)
                shares = _shares(table, table.header(), now) if others else {}
                kept = next_waiter([me, *others], shares) is me
                if kept:
                    mine = table.slot(turn.slot)
                    mine.klass, mine.urgent_at, mine.since = klass, urgent_at, now
                    mine.granted_at, mine.max_hold_s = now, lease_s
                    table.write(turn.slot, mine)
                else:
                    table.set_state(turn.slot, IDLE)
                    granted = self._fill(table, now, reap=False)
        self.counts.of(turn.klass).held_s += held_s
        if not kept:
            self._wake(granted)
            self._give_back_slot(turn.slot)
            return False
        turn.klass, turn.asked_at, turn.granted_at = klass, now, now
        return True

    def take_up(self, turn: Turn, klass: int) -> bool:
        """A kept turn starts its pass: counted, and held under the usual max_hold_s.
        False when waiters took it back after its lease ran out: the slot is given back
        and the pass must ask for a turn like any other (running it anyway would put it
        beside the turn's new holder)."""
        with self.table.locked() as table:
            mine = table.slot(turn.slot)
            held = mine.pid == self._pid and mine.state == HOLDING
            if held:
                mine.klass, mine.max_hold_s = klass, self.settings.max_hold_s
                table.write(turn.slot, mine)
        if not held:
            self._give_back_slot(turn.slot)
            return False
        turn.klass = klass
        self._note_granted(turn)
        return True

    def _waiting(self, table: TurnTable, now: float) -> list[Waiter]:
        return [
            _waiter(index, row, now)
            for index, row in enumerate(table.rows(table.header().high_water))
            if row[STATE] == WAITING
        ]

    def withdraw(self, turn: Turn) -> None:
        """A turn asked for and no longer wanted (its caller was cancelled): passed on if
        it was granted meanwhile."""
        with self.table.locked() as table:
            mine = table.slot(turn.slot)
            was_holding = mine.state == HOLDING and mine.pid == self._pid
            if mine.pid == self._pid:
                mine.state = IDLE
                table.write(turn.slot, mine)
            granted = self._fill(table, self._clock(), reap=False) if was_holding else []
        self._wake(granted)
        self._give_back_slot(turn.slot)

    # A realtime pass first (pause.py).

    def pause_lower(self, klass: int) -> Stop:
        """Stops the other processes holding turns of classes below `klass` for this
        process's pass; give the result to `resume`."""
        now = self._clock()
        with self.table.locked() as table:

            @functools.cache
            def shares() -> dict[int, float]:
                return _shares(table, table.header(), now)

            paused = pause_lower(table, self._pid, klass, now, shares, self._signal)
            pids = frozenset(table.slot(index).pid for index in paused)
        self.counts.paused += len(paused)
        return Stop(paused, now, pids)

    def resume(self, stop: Stop) -> float:
        """Continues what `pause_lower` stopped; returns for how long it was stopped."""
        slots, since, pids = stop
        if not slots:
            return 0.0
        with self.table.locked() as table:
            resume(table, self._pid, slots, pids, self._signal)
        stopped_s = max(0.0, self._clock() - since)
        self.counts.paused_s += stopped_s
        return stopped_s

    # Reading the device.

    def shares(self) -> dict[int, float]:
        """Each model's share of the device's recent busy time, by model key."""
        with self.table.locked() as table:
            return _shares(table, table.header(), self._clock())

    def my_share(self) -> float:
        return self.shares().get(self._model_key, 0.0)

    def report(self) -> dict[str, object]:
        """For the replica's info (/v1/stats): turns, waits and time held per class."""
        with self.table.locked() as table:
            header = table.header()
            slots = list(table.in_use())
            shares = _shares(table, header, self._clock())
        return {
            "table": str(self.table.path),
            "capacity": header.capacity,
            "weight": self.settings.weight,
            "priority": self.settings.priority,
            "min_share": self.settings.min_share,
            "replicas_on_device": len({s.pid for _, s in slots}),
            "holding": sum(1 for _, s in slots if s.state == HOLDING),
            "waiting": sum(1 for _, s in slots if s.state == WAITING),
            "share": round(shares.get(self._model_key, 0.0), 4),
            "taken_back": self.counts.taken_back,
            "paused": self.counts.paused,
            "paused_s": round(self.counts.paused_s, 6),
            "continued_stale": self.counts.continued_stale,
            "by_class": {
                klass: {
                    "turns": c.turns,
                    "waited_turns": c.waited_turns,
                    "wait_s": round(c.waited_s, 6),
                    "held_s": round(c.held_s, 6),
                }
                for klass, c in sorted(self.counts.by_class.items())
            },
        }

    def close(self) -> None:
        """Frees this replica's slots (a process that dies without it is found by pid)."""
        with self.table.locked() as table:
            for index in self._slots:
                if table.slot(index).pid == self._pid:
                    table.write(index, Slot())
            granted = self._fill(table, self._clock(), reap=False)
        self._wake(granted)
        for index, sock in self._wakers.items():
            sock.close()
            with suppress(FileNotFoundError):
                os.unlink(self._socket_path(index))
        self._sender.close()

    # Under the lock.

    def _fill(self, table: TurnTable, now: float, reap: bool) -> list[int]:
        """Grants waiting passes, most urgent first, while capacity allows (one pass
        always may run, whatever its weight); `reap` first frees turns whose holder died
        or held too long, slots of dead waiters, and stops (`pause.py`) whose stopper died
        or overran. While a holder is stopped for a realtime pass, only realtime passes
        are granted: a lower one would take the cores the stop freed. Returns the slots
        granted."""
        if reap:
            self.counts.continued_stale += resume_stale(
                table, now, self._alive, signal_to=self._signal
            )
        header = table.header()
        held = 0
        paused = False
        waiters: list[Waiter] = []
        for index, row in enumerate(table.rows(header.high_water)):
            state, pid = row[STATE], row[PID]
            if state == FREE:
                continue
            if reap and pid != self._pid and not self._alive(int(pid)):
                table.write(index, Slot())
                self.counts.taken_back += state == HOLDING
                continue
            if state == HOLDING:
                if reap and self._hung(row, now):
                    table.set_state(index, IDLE)
                    self.counts.taken_back += 1
                    continue
                held += int(row[WEIGHT])
                paused = paused or bool(row[PAUSED_BY])
            elif state == WAITING:
                waiters.append(_waiter(index, row, now))
        granted: list[int] = []
        shares: dict[int, float] | None = None
        while waiters:
            if shares is None:
                shares = _shares(table, header, now) if len(waiters) > 1 else {}
            best = next_waiter(waiters, shares)
            assert best is not None
            # A pass starts while a unit is free, even one heavier than what is left:
            # on a CPU a one-thread LLM step holding one of two cores left the other idle
            # while a two-thread rerank pass waited for it (issue 28's throughput on an
            # AMX Xeon, 0.76-0.87x of the arbiter off). No smaller pass jumps ahead of
            # the most urgent one.
            if held >= header.capacity:
                break
            if paused and best.klass > REALTIME:
                break
            table.grant(best.slot, now)
            held += best.weight
            waiters.remove(best)
            granted.append(best.slot)
        return granted

    def _hung(self, row: tuple[int | float, ...], now: float) -> bool:
        """A holder past its `max_hold_s`, or frozen by someone else's stop."""
        held_s = now - row[GRANTED_AT]
        if held_s > row[MAX_HOLD_S]:
            return True
        return (
            held_s > STOPPED_HOLDER_S
            and not row[PAUSED_BY]
            and row[PID] != self._pid
            and self._stopped(int(row[PID]))
        )

    def _granted_yet(self, turn: Turn) -> bool:
        now = self._clock()
        with self.table.locked() as table:
            mine = table.slot(turn.slot)
            if mine.state != HOLDING or mine.pid != self._pid:
                granted = self._fill(table, now, reap=True)
                mine = table.slot(turn.slot)
            else:
                granted = []
        self._wake(granted, besides=turn.slot)
        if mine.state == HOLDING and mine.pid == self._pid:
            turn.granted_at = mine.granted_at
            self._note_granted(turn)
            return True
        if mine.pid != self._pid or mine.state != WAITING:
            # The table lost our slot (rebuilt under us): the pass runs rather than wait
            # on nothing; the slot is ours again for the next turn.
            with self.table.locked() as table:
                table.write(turn.slot, Slot(pid=self._pid, state=HOLDING, granted_at=now))
            turn.granted_at = now
            self._note_granted(turn)
            return True
        return False

    def _add_busy(self, table: TurnTable, index: int, s: Slot, held_s: float, now: float) -> None:
        header = table.header()
        tau = header.tau_s
        s.busy = decayed(s.busy, s.busy_at, now, tau) + held_s
        s.busy_at = now
        table.write(index, s)
        header.device_busy = decayed(header.device_busy, header.device_busy_at, now, tau) + held_s
        header.device_busy_at = now
        table.write_header(header)

    # Around the lock.

    def _note_granted(self, turn: Turn) -> None:
        counts = self.counts.of(turn.klass)
        counts.turns += 1
        counts.waited_s += turn.waited_s
        counts.waited_turns += turn.waited_s > 0

    def _wake(self, slots: list[int], besides: int | None = None) -> None:
        for index in slots:
            if index != besides:
                with suppress(OSError):
                    self._sender.sendto(b"!", self._socket_path(index))

    def _give_back_slot(self, index: int) -> None:
        with self._idle_lock:
            self._idle.append(index)


def _waiter(index: int, row: tuple[int | float, ...], now: float) -> Waiter:
    """A waiting slot's row as the order reads it."""
    return Waiter(
        index,
        int(row[MODEL_KEY]),
        int(row[KLASS]),
        int(row[PRIORITY]),
        urgency(row[URGENT_AT], now),
        row[SINCE],
        row[MIN_SHARE],
        int(row[WEIGHT]),
    )


def _shares(table: TurnTable, header: Header, now: float) -> dict[int, float]:
    total = decayed(header.device_busy, header.device_busy_at, now, header.tau_s)
    if total <= 0:
        return {}
    by_model: dict[int, float] = {}
    for _, s in table.in_use():
        busy = decayed(s.busy, s.busy_at, now, header.tau_s)
        by_model[s.model_key] = by_model.get(s.model_key, 0.0) + busy
    return {key: busy / total for key, busy in by_model.items()}


def _or(klass: int | None, default: int) -> int:
    return default if klass is None else klass


def _drain(sock: socket.socket) -> None:
    with suppress(BlockingIOError, InterruptedError):
        while sock.recv(16):
            pass


def table_path(base: Path, node: str, device: str) -> Path:
    """One table per device of a node: `device` is `cpu` or `gpu<id>`."""
    return base / f"{node}-{device}.turns"
