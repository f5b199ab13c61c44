"""One model's queues at the ingress: a coalescer per priority class behind admission.

Each class has its own coalescer with its own calls in flight, so a realtime request
never waits behind a batch-class group at the ingress; the model deployment then orders
the classes' batches at its priority gate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from deployments.core.admission import Admission, ClassLimits, Refusal
from deployments.core.coalescer import Coalescer, Send
from deployments.core.priority import ALL_PRIORITIES, Priority
from deployments.core.throughput import RateMeter

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")


class Refused(Exception):
    def __init__(self, priority: Priority, refusal: Refusal) -> None:
        super().__init__(f"{priority.label}: {refusal.reason}")
        self.priority = priority
        self.refusal = refusal


@dataclass(frozen=True)
class ClassSettings:
    limits: ClassLimits
    max_in_flight: int


class ClassQueues(Generic[Job, Outcome]):
    def __init__(
        self,
        send: Callable[[Priority], Send[Job, Outcome]],
        settings: Mapping[Priority, ClassSettings],
        *,
        size_of: Callable[[Job], int],
        max_group_items: int,
        on_abandon: Callable[[Job], None] | None = None,
        meter: RateMeter | None = None,
    ) -> None:
        self._size_of = size_of
        self._admission = Admission({p: s.limits for p, s in settings.items()})
        self._meter = meter or RateMeter()
        self._refused: dict[tuple[Priority, str], int] = {}
        self._coalescers: dict[Priority, Coalescer[Job, Outcome]] = {
            priority: Coalescer(
                send(priority),
                size_of=size_of,
                max_in_flight=settings[priority].max_in_flight,
                max_group_items=max_group_items,
                on_abandon=on_abandon,
            )
            for priority in ALL_PRIORITIES
        }

    def queued_items(self) -> dict[Priority, int]:
        return {p: c.queued_items for p, c in self._coalescers.items()}

    def load(self, priority: Priority) -> tuple[int, int]:
        """The class's items waiting here and its calls out to the model now."""
        coalescer = self._coalescers[priority]
        return coalescer.queued_items, coalescer.in_flight

    async def submit(
        self,
        priority: Priority,
        job: Job,
        deadline: float | None,
        since: float | None = None,
    ) -> Outcome:
        """The job's outcome. Raises Refused when admission turns it away, or
        DeadlineExpired when `deadline` (event-loop clock) passes first. `since`: when the
        job's request arrived (time.monotonic())."""
        size = self._size_of(job)
        refusal = self._admission.check(priority, size, self.queued_items(), self._meter.rate())
        if refusal is not None:
            key = (priority, refusal.reason)
            self._refused[key] = self._refused.get(key, 0) + 1
            raise Refused(priority, refusal)
        outcome = await self._coalescers[priority].submit(job, deadline, since)
        self._meter.add(size)
        return outcome

    def stats(self) -> dict[str, Any]:
        classes: dict[str, Any] = {}
        for priority, coalescer in self._coalescers.items():
            refused = {reason: n for (p, reason), n in self._refused.items() if p is priority and n}
            classes[priority.label] = {**vars(coalescer.stats), "refused": refused}
        return {"items_per_s": round(self._meter.rate(), 1), "classes": classes}


def loop_deadline(timeout_s: float | None) -> float | None:
    """An absolute deadline on the running loop's clock, `timeout_s` from now."""
    if timeout_s is None:
        return None
    return asyncio.get_running_loop().time() + timeout_s
