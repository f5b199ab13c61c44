"""The state every replica on one device shares: a small file mapped into each process's
memory (in /dev/shm where there is one), with one slot per replica pass that may ask for a
turn. A file lock serialises every change, held for microseconds: nothing waits under it.

Each slot says whose it is (pid), whether it is idle, waiting or holding a turn, and what
the waiting pass is (class, model priority, urgency, weight), and keeps its model's recent
busy time, decayed exponentially, so shares of the device can be read by anyone. A holder
stopped for a realtime pass of another process says by whom and since when (`pause.py`).

There is no arbiter process to lose: the state is the file. A process that dies holding a
turn is found by its pid and its turn taken back; one that hangs loses the turn after its
`max_hold_s`. A file of another layout (another release of Tributary) is rebuilt.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"TRIBTURN"
LAYOUT_VERSION = 2
SLOTS = 64

# magic, layout version, capacity (units), slots in use (high water), device busy
# seconds (decayed), when that was last decayed, the decay's time constant
HEADER = struct.Struct("<8sIIIxxxxddd")
# pid, state, class, model priority, weight, paused by (a pid, 0 when running), min_share,
# since, urgent_at, granted_at, max_hold_s, busy seconds (decayed), when that was last
# decayed, model key, paused at
SLOT = struct.Struct("<iiiiiidddddddQd")
HEADER_SIZE = 64
SLOT_SIZE = 96
FILE_SIZE = HEADER_SIZE + SLOTS * SLOT_SIZE

FREE, IDLE, WAITING, HOLDING = 0, 1, 2, 3

# Where a slot's fields are in `SLOT.unpack` order, for reading rows without objects.
PID, STATE, KLASS, PRIORITY, WEIGHT, PAUSED_BY, MIN_SHARE, SINCE, URGENT_AT = range(9)
GRANTED_AT, MAX_HOLD_S, BUSY, BUSY_AT, MODEL_KEY, PAUSED_AT = range(9, 15)
# A grant changes two fields, written in place: the state, and when it was granted.
_STATE = struct.Struct("<i")
_GRANTED_AT = struct.Struct("<d")
_STATE_OFFSET, _GRANTED_AT_OFFSET = 4, 48

# Waiting for the file's lock: first look again after this, then up to 1 ms apart; after
# STOPPED_HOLDER_S without it, continue any holder stopped inside it (_take_file_lock).
# The lock is held for microseconds, so a wait of milliseconds is a stopped holder.
LOCK_POLL_S = 0.00005
STOPPED_HOLDER_S = 0.005


def send_signal(pid: int, sig: int) -> None:
    """os.kill, quiet about a process that is gone or not ours to signal."""
    with suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def stopped_pids(rows: Iterable[tuple[int | float, ...]]) -> set[int]:
    """The processes of these slot rows that a realtime pass has stopped (pause.py)."""
    return {int(row[PID]) for row in rows if row[PAUSED_BY] and row[STATE] != FREE}


@dataclass
class Slot:
    pid: int = 0
    state: int = FREE
    klass: int = 0
    priority: int = 0
    weight: int = 1
    paused_by: int = 0
    min_share: float = 0.0
    since: float = 0.0
    urgent_at: float = math.inf
    granted_at: float = 0.0
    max_hold_s: float = 0.0
    busy: float = 0.0
    busy_at: float = 0.0
    model_key: int = 0
    paused_at: float = 0.0


@dataclass
class Header:
    capacity: int
    high_water: int
    device_busy: float
    device_busy_at: float
    tau_s: float


def decayed(value: float, since: float, now: float, tau_s: float) -> float:
    """`value` as of `since`, decayed to `now` with time constant `tau_s`."""
    if now <= since or value == 0.0:
        return value
    return value * math.exp(-(now - since) / tau_s)


class TurnTable:
    def __init__(self, path: Path, capacity: int, tau_s: float) -> None:
        """Opens the device's table at `path`, creating it when missing or of another
        layout; `capacity` (units of weight held at once) and `tau_s` (the share window)
        are written into it: the device's replicas share one config."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        # In-process threads share the file's lock (flock belongs to the open file), so
        # they take this one first.
        self._thread_lock = threading.Lock()
        self._locked = _Locked(self)
        with self._file_lock():
            if os.fstat(self._fd).st_size != FILE_SIZE:
                os.ftruncate(self._fd, FILE_SIZE)
            self._map = mmap.mmap(self._fd, FILE_SIZE)
            magic, version, *_ = HEADER.unpack_from(self._map, 0)
            if magic != MAGIC or version != LAYOUT_VERSION:
                self._map[:] = bytes(FILE_SIZE)
                HEADER.pack_into(self._map, 0, MAGIC, LAYOUT_VERSION, capacity, 0, 0.0, 0.0, tau_s)
            header = self.header()
            header.capacity, header.tau_s = capacity, tau_s
            self.write_header(header)

    def locked(self) -> _Locked:
        """`with table.locked() as table:` every read and change of the table."""
        return self._locked

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        self._take_file_lock()
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _take_file_lock(self) -> None:
        """The file's lock, never waited for without end. A process stopped for a realtime
        pass (pause.py) is stopped a moment after the signal is sent, outside the lock, and
        in that moment it may take the lock: everyone would then wait for it until the
        stopper continues it, and the stopper itself may be among those waiting. So a wait
        past `STOPPED_HOLDER_S` continues every stopped holder (that stop is cut short)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        delay = LOCK_POLL_S
        stalled_at = time.monotonic() + STOPPED_HOLDER_S
        while True:
            time.sleep(delay)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            delay = min(delay * 2, 0.001)
            if time.monotonic() > stalled_at:
                self._continue_stopped()
                stalled_at = time.monotonic() + STOPPED_HOLDER_S

    def _continue_stopped(self) -> None:
        """SIGCONT to every process the table says is stopped, read without the lock (a
        continue sent to a process that runs changes nothing)."""
        # Read from the file, not the map: opening the table takes this lock before the map
        # exists.
        data = os.pread(self._fd, FILE_SIZE, 0)
        if len(data) != FILE_SIZE or HEADER.unpack_from(data)[:2] != (MAGIC, LAYOUT_VERSION):
            return
        for pid in stopped_pids(SLOT.iter_unpack(data[HEADER_SIZE:])):
            send_signal(pid, signal.SIGCONT)

    # Everything below is called with the lock held.

    def header(self) -> Header:
        _, _, capacity, high_water, busy, busy_at, tau_s = HEADER.unpack_from(self._map, 0)
        return Header(capacity, high_water, busy, busy_at, tau_s)

    def write_header(self, h: Header) -> None:
        HEADER.pack_into(
            self._map,
            0,
            MAGIC,
            LAYOUT_VERSION,
            h.capacity,
            h.high_water,
            h.device_busy,
            h.device_busy_at,
            h.tau_s,
        )

    def slot(self, index: int) -> Slot:
        return Slot(*SLOT.unpack_from(self._map, HEADER_SIZE + index * SLOT_SIZE))

    def write(self, index: int, s: Slot) -> None:
        SLOT.pack_into(
            self._map,
            HEADER_SIZE + index * SLOT_SIZE,
            s.pid,
            s.state,
            s.klass,
            s.priority,
            s.weight,
            s.paused_by,
            s.min_share,
            s.since,
            s.urgent_at,
            s.granted_at,
            s.max_hold_s,
            s.busy,
            s.busy_at,
            s.model_key,
            s.paused_at,
        )

    def rows(self, high_water: int) -> list[tuple[int | float, ...]]:
        """Slots 0..high_water as raw tuples (fields at the indices above): the hot path
        reads them without building objects."""
        end = HEADER_SIZE + high_water * SLOT_SIZE
        return list(SLOT.iter_unpack(self._map[HEADER_SIZE:end]))

    def grant(self, index: int, now: float) -> None:
        offset = HEADER_SIZE + index * SLOT_SIZE
        _STATE.pack_into(self._map, offset + _STATE_OFFSET, HOLDING)
        _GRANTED_AT.pack_into(self._map, offset + _GRANTED_AT_OFFSET, now)

    def set_state(self, index: int, state: int) -> None:
        _STATE.pack_into(self._map, HEADER_SIZE + index * SLOT_SIZE + _STATE_OFFSET, state)

    def in_use(self) -> Iterator[tuple[int, Slot]]:
        for index in range(self.header().high_water):
            s = self.slot(index)
            if s.state != FREE:
                yield index, s

    def claim(self, pid: int, is_alive: Callable[[int], bool]) -> int:
        """A free slot for `pid` (a dead process's slot counts as free)."""
        header = self.header()
        for index in range(SLOTS):
            s = self.slot(index)
            if s.state == FREE or (s.pid != pid and not is_alive(s.pid)):
                self.write(index, Slot(pid=pid, state=IDLE))
                if index >= header.high_water:
                    header.high_water = index + 1
                    self.write_header(header)
                return index
        raise RuntimeError(f"{self.path}: all {SLOTS} turn slots are taken")

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class _Locked:
    """The table's lock as a reusable context (cheaper than a generator per turn): the
    in-process lock first, since threads of one process share the file's lock."""

    def __init__(self, table: TurnTable) -> None:
        self._table = table

    def __enter__(self) -> TurnTable:
        table = self._table
        table._thread_lock.acquire()
        try:
            table._take_file_lock()
        except BaseException:
            table._thread_lock.release()
            raise
        return table

    def __exit__(self, *exc: object) -> None:
        table = self._table
        try:
            fcntl.flock(table._fd, fcntl.LOCK_UN)
        finally:
            table._thread_lock.release()
