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
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from deployments.core.priority import ALL_PRIORITIES, Priority, next_in_line


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
    ) -> None:
        """`capacity`: passes at once; `lane`: one more slot, for a realtime batch only."""
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
        # Set whenever a batch starts to wait: a pass waiting for its device turn looks
        # again at what it keeps waiting (`most_urgent_waiting`).
        self.waiter_came = asyncio.Event()

    def set_aged_after_s(self, aged_after_s: Mapping[Priority, float | None]) -> None:
        self._aged_after_s = dict(aged_after_s)

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
            self.release(lane)

    async def acquire(self, priority: Priority) -> bool:
        """Waits for a slot; True when the one granted is the realtime lane."""
        if self._running < self._capacity and not any(self._queues.values()):
            self._running += 1
            self._turns[priority] += 1
            return False
        if self._lane_open_to(priority) and not self._queues[priority]:
            self._take_lane(priority)
            return True
        turn = _Turn(priority, self._clock(), asyncio.get_running_loop().create_future())
        self._queues[priority].append(turn)
        self.waiter_came.set()
        try:
            await turn.granted
        except asyncio.CancelledError:
            if turn.granted.done() and not turn.granted.cancelled():
                self.release(turn.lane)  # granted as we were cancelled: pass the turn on
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

    def release(self, lane: bool = False) -> None:
        if lane:
            self._lane_busy = False
            self._grant_lane()
            return
        self._running -= 1
        self._grant_next()

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
        turn = self._next_turn()
        if turn is None:
            return False
        self._queues[turn.priority].remove(turn)
        self._running += 1
        self._turns[turn.priority] += 1
        turn.granted.set_result(None)
        return True

    def _next_turn(self) -> _Turn | None:
        turn, aged = next_in_line(self._queues, self._aged_after_s, self._clock())
        self._aged_turns += aged
        return turn
