"""Coalesce concurrent requests into few downstream calls.

Every call from the ingress to a model deployment costs a Ray round trip (serialisation,
scheduling, a context switch on each side); on a small machine those hops, not the model,
bound throughput. The ingress therefore keeps at most `max_in_flight` calls open per model
and class. Requests that arrive while all of them are busy wait here and leave together,
as one call carrying one job per request, as soon as a call returns. Under light load a
request goes out at once on its own; under heavy load groups grow by themselves, with no
timer to tune.

Each call also tells the model how long each of its jobs has spent so far (from `since`,
when its request reached the ingress), so that a replica judging a class's latency target
sees the time before it too.

A job whose deadline passes while it waits here never leaves; one whose client goes away
is dropped, and once every job of a call is gone the call itself is cancelled. When only
some jobs of a call are gone, `on_abandon` tells the caller, which can tell the model.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")

# send(jobs, seconds left per job (None = no deadline), seconds each job has spent since its
# request arrived) -> one outcome per job, in order
Send = Callable[[list[Job], list[float | None], list[float]], Awaitable[list[Outcome]]]


class DeadlineExpired(Exception):
    """The job's deadline passed before its answer came."""


class CallInterrupted(Exception):
    """The downstream call ended in a cancellation nobody here asked for (every job of a
    call that this module cancels is gone). Its jobs' clients are still waiting: they get
    this failure, never a cancellation of their own, which their handlers would take for
    their client leaving and answer with nothing (a bare 500 from the HTTP server)."""


class _State(Enum):
    QUEUED = "queued"
    SENT = "sent"
    ANSWERED = "answered"
    GONE = "gone"


@dataclass(eq=False)
class _Waiting(Generic[Job, Outcome]):
    job: Job
    size: int
    future: asyncio.Future[Outcome]
    deadline: float | None  # on the event loop's clock
    # When the job's request arrived, on time.monotonic()'s clock: a loop's own clock may
    # be another (uvloop's counts milliseconds), and the request's start was read there.
    since: float
    state: _State = _State.QUEUED
    call: _Call | None = None


@dataclass(eq=False)
class _Call:
    members: list[_Waiting]
    task: asyncio.Task[None] | None = None
    gone: int = 0


@dataclass
class CoalescerStats:
    calls: int = 0
    jobs: int = 0
    items: int = 0
    expired: int = 0
    abandoned: int = 0
    cancelled_calls: int = 0
    largest_call_jobs: int = 0
    in_flight: int = 0
    queued_jobs: int = 0
    queued_items: int = 0


@dataclass
class _Counters:
    queued_jobs: int = 0
    queued_items: int = 0
    in_flight: int = 0
    calls: set[asyncio.Task[None]] = field(default_factory=set)


class Coalescer(Generic[Job, Outcome]):
    def __init__(
        self,
        send: Send[Job, Outcome],
        *,
        size_of: Callable[[Job], int],
        max_in_flight: int,
        max_group_items: int,
        on_abandon: Callable[[Job], None] | None = None,
    ) -> None:
        if max_in_flight < 1 or max_group_items < 1:
            raise ValueError("coalescer bounds must be >= 1")
        self._send = send
        self._size_of = size_of
        self._max_in_flight = max_in_flight
        self._max_group_items = max_group_items
        self._on_abandon = on_abandon
        self._pending: deque[_Waiting[Job, Outcome]] = deque()
        self._now = _Counters()
        self._dispatch_scheduled = False
        self._stats = CoalescerStats()

    @property
    def queued_items(self) -> int:
        return self._now.queued_items

    @property
    def in_flight(self) -> int:
        return self._now.in_flight

    @property
    def stats(self) -> CoalescerStats:
        self._stats.in_flight = self._now.in_flight
        self._stats.queued_jobs = self._now.queued_jobs
        self._stats.queued_items = self._now.queued_items
        return self._stats

    async def submit(
        self, job: Job, deadline: float | None = None, since: float | None = None
    ) -> Outcome:
        """The job's outcome; DeadlineExpired once the loop's clock passes `deadline`.
        `since`: when its request arrived (time.monotonic()); now when not given."""
        loop = asyncio.get_running_loop()
        waiting: _Waiting[Job, Outcome] = _Waiting(
            job,
            self._size_of(job),
            loop.create_future(),
            deadline,
            time.monotonic() if since is None else since,
        )
        self._pending.append(waiting)
        self._now.queued_jobs += 1
        self._now.queued_items += waiting.size
        self._schedule_dispatch(loop)
        try:
            async with asyncio.timeout_at(deadline):
                return await waiting.future
        except TimeoutError:
            if waiting.future.done() and not waiting.future.cancelled():
                # The answer came in the loop turn the deadline fired (or the dispatcher
                # expired the job, or the downstream raised its own TimeoutError): it stands.
                return waiting.future.result()
            self._leave(waiting)
            self._stats.expired += 1
            raise DeadlineExpired() from None
        except asyncio.CancelledError:
            self._leave(waiting)
            raise

    @staticmethod
    def _fail(group: list[_Waiting[Job, Outcome]], exc: Exception) -> None:
        for waiting in group:
            waiting.state = _State.ANSWERED
            if not waiting.future.done():
                waiting.future.set_exception(exc)

    def _leave(self, waiting: _Waiting[Job, Outcome]) -> None:
        if waiting.state is _State.QUEUED:
            self._unqueue(waiting)
        elif waiting.state is _State.SENT and waiting.call is not None:
            call = waiting.call
            call.gone += 1
            self._stats.abandoned += 1
            if call.gone == len(call.members) and call.task is not None:
                self._stats.cancelled_calls += 1
                call.task.cancel()
            elif self._on_abandon is not None:
                self._on_abandon(waiting.job)
        waiting.state = _State.GONE

    def _unqueue(self, waiting: _Waiting[Job, Outcome]) -> None:
        # Left in the deque and skipped when met: removal from its middle costs O(n).
        self._now.queued_jobs -= 1
        self._now.queued_items -= waiting.size
        waiting.state = _State.GONE

    def _schedule_dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        # Deferred to the next loop turn so requests that arrived in the same turn
        # leave in the same call.
        if not self._dispatch_scheduled and self._now.in_flight < self._max_in_flight:
            self._dispatch_scheduled = True
            loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        loop = asyncio.get_running_loop()
        while self._now.in_flight < self._max_in_flight:
            group = self._take_group(loop.time())
            if not group:
                return
            self._now.in_flight += 1
            call = _Call(group)
            for waiting in group:
                waiting.state = _State.SENT
                waiting.call = call
            call.task = loop.create_task(self._call(call, loop))
            self._now.calls.add(call.task)
            call.task.add_done_callback(self._now.calls.discard)

    def _take_group(self, now: float) -> list[_Waiting[Job, Outcome]]:
        group: list[_Waiting[Job, Outcome]] = []
        items = 0
        while self._pending:
            head = self._pending[0]
            if head.state is not _State.QUEUED or head.future.done():
                # Gone, or cancelled with its waiter yet to run, which then unqueues it.
                self._pending.popleft()
                continue
            if head.deadline is not None and head.deadline <= now:
                self._pending.popleft()
                self._unqueue(head)
                self._stats.expired += 1
                head.future.set_exception(DeadlineExpired())
                continue
            if group and items + head.size > self._max_group_items:
                break
            self._pending.popleft()
            self._now.queued_jobs -= 1
            self._now.queued_items -= head.size
            group.append(head)
            items += head.size
        return group

    async def _call(self, call: _Call, loop: asyncio.AbstractEventLoop) -> None:
        group: list[_Waiting[Job, Outcome]] = call.members
        stats = self._stats
        stats.calls += 1
        stats.jobs += len(group)
        stats.items += sum(w.size for w in group)
        stats.largest_call_jobs = max(stats.largest_call_jobs, len(group))
        now = loop.time()
        time_left = [None if w.deadline is None else w.deadline - now for w in group]
        sent_at = time.monotonic()
        spent = [max(sent_at - w.since, 0.0) for w in group]
        try:
            outcomes = await self._send([w.job for w in group], time_left, spent)
            if len(outcomes) != len(group):
                raise RuntimeError(
                    f"downstream returned {len(outcomes)} outcomes for {len(group)} jobs"
                )
            for waiting, outcome in zip(group, outcomes, strict=True):
                waiting.state = _State.ANSWERED
                if not waiting.future.done():
                    waiting.future.set_result(outcome)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                for waiting in group:
                    waiting.future.cancel()
                raise
            self._fail(group, CallInterrupted("the call to the model was cancelled"))
        except Exception as exc:  # every waiter must hear of any failure, never hang
            self._fail(group, exc)
        finally:
            self._now.in_flight -= 1
            if self._now.queued_jobs:
                self._schedule_dispatch(loop)
