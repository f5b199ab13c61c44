"""Who gets the next generation slot in a replica: at most `max_num_seqs` sequences and
`max_tokens` of KV cache (prompt + max new tokens, summed) in flight, the rest waiting by
priority class.

A continuous-batching engine takes in whatever it is given and interleaves it, so it has
no notion of priority: a realtime request added behind 200 batch-class ones would wait for
a share of every step with all of them. The slots in front of it keep the engine's batch
small enough to be fast and decide who enters it: the waiting request of the highest
class first, except that one whose class has `aged_after_s` and that has waited that long
goes first (bulk work slows down, never starves). The head of the queue is never skipped
for a smaller request behind it, so a long prompt cannot be passed over for ever. A
request whose deadline passes while it waits leaves with `SlotTimeout`; one that finds its
class's queue full is refused at once with `QueueFull`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from deployments.core.priority import ALL_PRIORITIES, Priority, next_in_line


class SlotTimeout(Exception):
    """The request's deadline passed before a slot was free."""


class QueueFull(Exception):
    def __init__(self, priority: Priority, queued: int, limit: int) -> None:
        super().__init__(f"{priority.label}: {queued} waiting, limit {limit}")
        self.priority = priority
        self.queued = queued
        self.limit = limit


@dataclass(frozen=True)
class SlotLimits:
    max_num_seqs: int
    max_tokens: int
    max_queued: Mapping[Priority, int]
    aged_after_s: Mapping[Priority, float | None] = field(default_factory=dict)


@dataclass(eq=False)
class Slot:
    priority: Priority
    tokens: int
    since: float
    granted: asyncio.Future[None] | None = None
    released: bool = False


@dataclass
class SlotStats:
    running: int = 0
    running_tokens: int = 0
    waiting: dict[str, int] = field(default_factory=dict)
    granted: dict[str, int] = field(default_factory=dict)
    aged_grants: int = 0
    timed_out: int = 0
    refused: int = 0


class SequenceSlots:
    def __init__(self, limits: SlotLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queues: dict[Priority, deque[Slot]] = {p: deque() for p in ALL_PRIORITIES}
        self._running = 0
        self._tokens = 0
        self._granted = dict.fromkeys(ALL_PRIORITIES, 0)
        self._aged = 0
        self._timed_out = 0
        self._refused = 0
        self.set_limits(limits)

    def set_limits(self, limits: SlotLimits) -> None:
        self.limits = limits
        self._grant_waiting()  # a larger limit may let waiting requests in now

    @property
    def stats(self) -> SlotStats:
        return SlotStats(
            running=self._running,
            running_tokens=self._tokens,
            waiting={p.label: len(q) for p, q in self._queues.items()},
            granted={p.label: n for p, n in self._granted.items()},
            aged_grants=self._aged,
            timed_out=self._timed_out,
            refused=self._refused,
        )

    async def acquire(self, priority: Priority, tokens: int, deadline: float | None) -> Slot:
        """A slot for a sequence of `tokens` (prompt + max new); `deadline` is on this
        object's clock. Release it with `release` once the sequence is over."""
        granted = self.try_acquire(priority, tokens)
        if granted is not None:
            return granted
        slot = Slot(priority, tokens, self._clock())
        queue = self._queues[priority]
        limit = self.limits.max_queued.get(priority, 0)
        if len(queue) >= limit:
            self._refused += 1
            raise QueueFull(priority, len(queue), limit)
        slot.granted = asyncio.get_running_loop().create_future()
        queue.append(slot)
        timeout = None if deadline is None else max(0.0, deadline - self._clock())
        try:
            await asyncio.wait_for(asyncio.shield(slot.granted), timeout)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if slot.granted.done() and not slot.granted.cancelled():
                self.release(slot)  # granted as it gave up: pass the slot on
            else:
                slot.granted.cancel()
                if slot in queue:
                    queue.remove(slot)
                self._grant_waiting()  # it may have been the head that blocked others
            if isinstance(exc, TimeoutError):
                self._timed_out += 1
                raise SlotTimeout() from None
            raise
        return slot

    def try_acquire(self, priority: Priority, tokens: int) -> Slot | None:
        """A slot now if one is free and nobody waits for one, else None."""
        if any(self._queues.values()) or not self._fits(tokens):
            return None
        slot = Slot(priority, tokens, self._clock())
        self._grant(slot)
        return slot

    def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self._running -= 1
        self._tokens -= slot.tokens
        self._grant_waiting()

    def _fits(self, tokens: int) -> bool:
        if self._running == 0:
            return True  # a request larger than the budget still runs, alone
        return (
            self._running < self.limits.max_num_seqs
            and self._tokens + tokens <= self.limits.max_tokens
        )

    def _grant(self, slot: Slot) -> None:
        self._running += 1
        self._tokens += slot.tokens
        self._granted[slot.priority] += 1

    def _grant_waiting(self) -> None:
        while True:
            slot, aged = self._next()
            if slot is None or not self._fits(slot.tokens):
                return
            self._queues[slot.priority].popleft()
            if slot.granted is None or slot.granted.done():
                continue  # gave up already; its task has not run to remove it yet
            self._aged += aged
            self._grant(slot)
            slot.granted.set_result(None)

    def _next(self) -> tuple[Slot | None, bool]:
        """The slot to grant next, and whether ageing put it ahead of a higher class."""
        for queue in self._queues.values():  # drop heads that gave up
            while queue and queue[0].granted is not None and queue[0].granted.done():
                queue.popleft()
        return next_in_line(self._queues, self.limits.aged_after_s, self._clock())
