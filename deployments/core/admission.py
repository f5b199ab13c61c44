"""Who waits and who is turned away, per model, by priority class.

Each class has a bound on its own queue. Normal and batch also have a shedding threshold
on everything queued for the model, all classes together: as the queue grows the batch
class is turned away first (it has the lower threshold), then normal. Realtime is refused
only when its own queue is full. A refused client is told how long to wait from the work
ahead of it and the rate the model has recently been getting through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deployments.core.priority import Priority
from deployments.core.throughput import retry_after_s

# The rate is recent history: when a flood starts on an idle server it is still the idle
# rate, and the estimate would send clients away for minutes while the queue drains in
# seconds. Past this, a client is better off asking again.
RETRY_AFTER_CEILING_S = 10.0


@dataclass(frozen=True)
class ClassLimits:
    max_queued_items: int
    shed_above_queued_items: int | None = None  # over all classes; None = never shed


@dataclass(frozen=True)
class Refusal:
    reason: str  # "shed" (load) or "queue_full" (this class's own bound)
    status: int
    retry_after_s: int
    queued_items: int
    limit: int


class Admission:
    def __init__(self, limits: Mapping[Priority, ClassLimits]) -> None:
        missing = set(Priority) - set(limits)
        if missing:
            raise ValueError(f"no limits for {sorted(p.label for p in missing)}")
        self._limits = dict(limits)

    def check(
        self,
        priority: Priority,
        size: int,
        queued: Mapping[Priority, int],
        items_per_s: float,
    ) -> Refusal | None:
        """None to admit a request of `size` items, else why not. `queued` is the items
        waiting for the model per class, `items_per_s` its recent throughput."""
        limits = self._limits[priority]
        own = queued.get(priority, 0)
        total = sum(queued.values())
        # A request larger than a bound still gets in when its queue is empty, so a
        # legal request is never refused on an idle server.
        if own and own + size > limits.max_queued_items:
            reason, ahead, limit = "queue_full", own, limits.max_queued_items
        elif (
            limits.shed_above_queued_items is not None
            and total
            and total + size > limits.shed_above_queued_items
        ):
            reason, ahead, limit = "shed", total, limits.shed_above_queued_items
        else:
            return None
        # 429 tells a client to back off and come back; realtime, never shed, gets 503:
        # its own bound is the server's capacity, not a share it overdrew.
        status = 503 if priority is Priority.REALTIME else 429
        wait = retry_after_s(ahead + size, items_per_s, ceiling_s=RETRY_AFTER_CEILING_S)
        return Refusal(reason, status, wait, ahead, limit)
