"""Coalesce concurrent requests into few downstream calls.

Every call from the ingress to a model deployment costs a Ray round trip (serialisation,
scheduling, a context switch on each side); on a small machine those hops, not the model,
bound throughput. The ingress therefore keeps at most `max_in_flight` calls open per model.
Requests that arrive while all of them are busy wait here and leave together, as one call
carrying one job per request, as soon as a call returns. Under light load a request goes
out at once on its own; under heavy load groups grow by themselves, with no timer to tune.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")


class QueueFull(Exception):
    """More items wait than the bound allows; the caller should answer 503."""

    def __init__(self, pending_items: int, limit: int) -> None:
        super().__init__(f"{pending_items} items already waiting (limit {limit})")
        self.pending_items = pending_items
        self.limit = limit


@dataclass(eq=False)
class _Waiting(Generic[Job, Outcome]):
    job: Job
    size: int
    future: asyncio.Future[Outcome]
    dropped: bool = False


@dataclass
class CoalescerStats:
    calls: int = 0
    jobs: int = 0
    items: int = 0
    rejected: int = 0
    largest_call_jobs: int = 0
    in_flight: int = 0
    pending_items: int = 0


class Coalescer(Generic[Job, Outcome]):
    def __init__(
        self,
        send: Callable[[list[Job]], Awaitable[list[Outcome]]],
        *,
        size_of: Callable[[Job], int],
        max_in_flight: int,
        max_group_items: int,
        max_pending_items: int,
    ) -> None:
        if max_in_flight < 1 or max_group_items < 1 or max_pending_items < 1:
            raise ValueError("coalescer bounds must be >= 1")
        self._send = send
        self._size_of = size_of
        self._max_in_flight = max_in_flight
        self._max_group_items = max_group_items
        self._max_pending_items = max_pending_items
        self._pending: deque[_Waiting[Job, Outcome]] = deque()
        self._pending_items = 0
        self._in_flight = 0
        self._dispatch_scheduled = False
        self._stats = CoalescerStats()
        self._calls: set[asyncio.Task[None]] = set()

    @property
    def stats(self) -> CoalescerStats:
        self._stats.in_flight = self._in_flight
        self._stats.pending_items = self._pending_items
        return self._stats

    async def submit(self, job: Job) -> Outcome:
        size = self._size_of(job)
        # One request larger than the bound still gets in when nothing waits, so a
        # legal request is never refused on an idle server.
        if self._pending_items and self._pending_items + size > self._max_pending_items:
            self._stats.rejected += 1
            raise QueueFull(self._pending_items, self._max_pending_items)
        loop = asyncio.get_running_loop()
        waiting: _Waiting[Job, Outcome] = _Waiting(job, size, loop.create_future())
        self._pending.append(waiting)
        self._pending_items += size
        self._schedule_dispatch(loop)
        try:
            return await waiting.future
        except asyncio.CancelledError:
            # A client that left before its call went out costs nothing downstream.
            if not waiting.dropped:
                waiting.dropped = True
                self._pending_items -= size
            raise

    def _schedule_dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        # Deferred to the next loop turn so requests that arrived in the same turn
        # leave in the same call.
        if not self._dispatch_scheduled and self._in_flight < self._max_in_flight:
            self._dispatch_scheduled = True
            loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        while self._in_flight < self._max_in_flight:
            group = self._take_group()
            if not group:
                return
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._call(group))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    def _take_group(self) -> list[_Waiting[Job, Outcome]]:
        group: list[_Waiting[Job, Outcome]] = []
        items = 0
        while self._pending:
            head = self._pending[0]
            if head.dropped:
                self._pending.popleft()
                continue
            if group and items + head.size > self._max_group_items:
                break
            self._pending.popleft()
            head.dropped = True  # leaves the pending count now; a late cancel must not
            self._pending_items -= head.size
            group.append(head)
            items += head.size
        return group

    async def _call(self, group: list[_Waiting[Job, Outcome]]) -> None:
        stats = self._stats
        stats.calls += 1
        stats.jobs += len(group)
        stats.items += sum(w.size for w in group)
        stats.largest_call_jobs = max(stats.largest_call_jobs, len(group))
        try:
            outcomes = await self._send([w.job for w in group])
            if len(outcomes) != len(group):
                raise RuntimeError(
                    f"downstream returned {len(outcomes)} outcomes for {len(group)} jobs"
                )
            for waiting, outcome in zip(group, outcomes, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(outcome)
        except asyncio.CancelledError:
            for waiting in group:
                waiting.future.cancel()
            raise
        except Exception as exc:  # every waiter must hear of any failure, never hang
            for waiting in group:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
        finally:
            self._in_flight -= 1
            if self._pending:
                self._schedule_dispatch(asyncio.get_running_loop())
