"""A set number of forward passes at a time (one unless the replica runs several side by
side), the most urgent waiting batch first.

Each priority class forms its own batches; before its forward pass a batch takes a turn at
the gate. When a pass ends, the gate hands the next turn to the waiting batch of the
highest class, except that a batch of a lower class that has waited longer than its class's
`aged_after_s` goes first: bulk work slows down under realtime load, but never starves.

A gate may also have a realtime lane: one more slot that only a realtime batch takes, when
every other slot is held. A pass cannot be interrupted, so without it a realtime request
that arrives just after a batch-class pass began waits that pass out; with it, it runs
beside it (on a thread of its own, replicas/batched/model_threads.py). A realtime batch
still takes an ordinary slot first where one is free: it has all the model's threads.

Realtime first on the cores too: while a realtime pass runs on the lane a free slot goes
to no batch of a lower class, and for `realtime_hold_s` after any realtime pass ends to no
batch of the batch class (unless it has waited past its `aged_after_s`). A pass started
then would share the cores with the next realtime pass, and realtime requests come in runs: measured
on 2 cores while a Batch API job ran, a realtime single text's median was twice its idle
one with batch passes starting beside the lane, within 15 % of it with a 15 or 30 ms hold
(docs/benchmarks.md, "Alternated rounds").
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from deployments.core.priority import ALL_PRIORITIES, Priority, has_aged, next_in_line


@dataclass(eq=False)
class _Turn:
    priority: Priority
    since: float
    granted: asyncio.Future[None]
    lane: bool = False  # granted the realtime lane, not an ordinary slot


@dataclass
class GateStats:
    busy: bool = False  # every pass slot taken
    running: int = 0
    capacity: int = 1
    waiting: dict[str, int] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)
    aged_turns: int = 0
    lane: bool = False  # has a realtime lane
    lane_busy: bool = False
    lane_turns: int = 0


class PriorityGate:
    def __init__(
        self,
        aged_after_s: Mapping[Priority, float | None],
        clock: Callable[[], float] = time.monotonic,
        capacity: int = 1,
        lane: bool = False,
        realtime_hold_s: float = 0.0,
    ) -> None:
        """`capacity`: passes at once; `lane`: one more slot, for a realtime batch only;
        `realtime_hold_s`: how long the batch class keeps out after a realtime pass."""
        self._aged_after_s = dict(aged_after_s)
        self._clock = clock
        self._queues: dict[Priority, deque[_Turn]] = {p: deque() for p in ALL_PRIORITIES}
        self._capacity = max(1, capacity)
        self._running = 0
        self._turns = dict.fromkeys(ALL_PRIORITIES, 0)
        self._aged_turns = 0
        self._has_lane = lane
        self._lane_busy = False
        self._lane_turns = 0
        self._realtime_hold_s = realtime_hold_s
        self._held_until = -math.inf  # lower classes keep out of free slots until then
        self._hold_timer: asyncio.TimerHandle | None = None
        # Set whenever a batch starts to wait: a pass waiting for its device turn looks
        # again at what it keeps waiting (`most_urgent_waiting`).
        self.waiter_came = asyncio.Event()

    def set_aged_after_s(self, aged_after_s: Mapping[Priority, float | None]) -> None:
        self._aged_after_s = dict(aged_after_s)

    def set_realtime_hold_s(self, seconds: float) -> None:
        self._realtime_hold_s = max(0.0, seconds)

    def set_capacity(self, capacity: int) -> None:
        """How many turns may be held at once; a raise grants waiting turns now."""
        self._capacity = max(1, capacity)
        while self._running < self._capacity and self._grant_next():
            pass

    @property
    def stats(self) -> GateStats:
        return GateStats(
            busy=self._running >= self._capacity,
            running=self._running,
            capacity=self._capacity,
            waiting={p.label: len(q) for p, q in self._queues.items()},
            turns={p.label: n for p, n in self._turns.items()},
            aged_turns=self._aged_turns,
            lane=self._has_lane,
            lane_busy=self._lane_busy,
            lane_turns=self._lane_turns,
        )

    def most_urgent_waiting(self) -> Priority | None:
        """The highest class with a batch waiting here, ageing aside: what a pass holding
        a slot keeps waiting, and so what that pass's device turn is asked for at."""
        return next((p for p in ALL_PRIORITIES if self._queues[p]), None)

    def next_waiting(self) -> Priority | None:
        """The class of the batch that would be granted the next free slot, if any waits."""
        turn, _ = next_in_line(self._queues, self._aged_after_s, self._clock())
        return None if turn is None or turn.granted.done() else turn.priority

    @asynccontextmanager
    async def turn(self, priority: Priority) -> AsyncIterator[bool]:
        """Holds a slot for one pass; says whether it is the realtime lane."""
        lane = await self.acquire(priority)
        try:
            yield lane
        finally:
            self.release(lane, priority)

    async def acquire(self, priority: Priority) -> bool:
        """Waits for a slot; True when the one granted is the realtime lane."""
        if (
            self._running < self._capacity
            and not any(self._queues.values())
            and not self._held_for_realtime(priority)
        ):
            self._running += 1
            self._turns[priority] += 1
            return False
        slot_free = self._running < self._capacity  # kept from lower classes for realtime
        if self._lane_open_to(priority) and not self._queues[priority] and not slot_free:
            self._take_lane(priority)
            return True
        turn = _Turn(priority, self._clock(), asyncio.get_running_loop().create_future())
        self._queues[priority].append(turn)
        self.waiter_came.set()
        if slot_free:
            self._grant_next()
            if not turn.granted.done() and self._lane_open_to(priority):
                # An aged batch of a lower class took the slot: the lane, then.
                self._queues[priority].remove(turn)
                self._take_lane(priority)
                return True
        try:
            await turn.granted
        except asyncio.CancelledError:
            if turn.granted.done() and not turn.granted.cancelled():
                # Granted as we were cancelled: pass the turn on (no pass ran, no hold).
                self.release(turn.lane)
            elif turn in self._queues[priority]:  # release() may have dropped it already
                self._queues[priority].remove(turn)
            raise
        return turn.lane

    @property
    def lane_free(self) -> bool:
        return self._lane_open_to(Priority.REALTIME)

    def move_to_lane(self) -> None:
        """A realtime batch that holds an ordinary slot takes the free lane instead (its
        pass would have to wait for the device there); the slot goes to the next batch."""
        if not self.lane_free:
            raise RuntimeError("the realtime lane is not free")
        self._lane_busy = True
        self._lane_turns += 1
        self._running -= 1
        self._grant_next()

    def release(self, lane: bool = False, priority: Priority | None = None) -> None:
        """After a pass: `lane` if it ran on the lane, `priority` its class (a realtime
        pass starts the hold; None: no pass ran)."""
        if lane:
            self._lane_busy = False
        else:
            self._running -= 1
        if priority is Priority.REALTIME and self._realtime_hold_s > 0:
            self._held_until = self._clock() + self._realtime_hold_s
            self._wake_when_the_hold_ends()
        if lane:
            self._grant_lane()
        self._grant_held()

    def keeps_out(self, priority: Priority) -> bool:
        """Whether a batch of the class would be kept out of a free slot now."""
        return self._held_for_realtime(priority)

    def _held_for_realtime(self, priority: Priority) -> bool:
        """Whether a batch of this class keeps out of a free slot: the lane runs, or (the
        batch class) a realtime pass ended less than `realtime_hold_s` ago."""
        if priority is Priority.REALTIME:
            return False
        # Only the batch class waits out the hold: it is there to fill idle time. Normal
        # traffic has a latency target of its own, and under load the idle time a hold
        # keeps would come off its throughput.
        return self._lane_busy or (priority is Priority.BATCH and self._clock() < self._held_until)

    def _wake_when_the_hold_ends(self) -> None:
        if self._hold_timer is not None:
            return  # it looks again when it fires
        left = self._held_until - self._clock()
        with contextlib.suppress(RuntimeError):  # no running loop: a test's own calls
            loop = asyncio.get_running_loop()
            self._hold_timer = loop.call_later(max(0.0, left), self._hold_may_end)

    def _hold_may_end(self) -> None:
        self._hold_timer = None
        if self._clock() < self._held_until:
            self._wake_when_the_hold_ends()  # extended by a later realtime pass
        else:
            self._grant_held()

    def _grant_held(self) -> None:
        """Grants free slots to waiting batches, as far as the hold lets them."""
        while self._running < self._capacity and self._grant_next():
            pass

    def _lane_open_to(self, priority: Priority) -> bool:
        return self._has_lane and priority is Priority.REALTIME and not self._lane_busy

    def _take_lane(self, priority: Priority) -> None:
        self._lane_busy = True
        self._turns[priority] += 1
        self._lane_turns += 1

    def _grant_lane(self) -> None:
        """Hands the free lane to the realtime batch waiting longest, if one waits."""
        queue = self._queues[Priority.REALTIME]
        while queue and queue[0].granted.done():
            queue.popleft()
        if not queue or not self._lane_open_to(Priority.REALTIME):
            return
        turn = queue.popleft()
        self._take_lane(turn.priority)
        turn.lane = True
        turn.granted.set_result(None)

    def _grant_next(self) -> bool:
        """Hands a free slot to the most urgent waiting turn; False when none waits."""
        # A turn cancelled since it queued, whose task has not yet run to take it out,
        # can no longer be granted: drop it here, or the gate would stay busy for no one.
        for queue in self._queues.values():
            while queue and queue[0].granted.done():
                queue.popleft()
        turn, aged = next_in_line(self._queues, self._aged_after_s, self._clock())
        if turn is None or (
            self._held_for_realtime(turn.priority)
            and not has_aged(turn, self._aged_after_s, self._clock())
        ):
            return False
        self._aged_turns += aged
        self._queues[turn.priority].remove(turn)
        self._running += 1
        self._turns[turn.priority] += 1
        turn.granted.set_result(None)
        return True
