"""Who waits and who is turned away, per model, by priority class.

First the fixed bounds, hard ceilings that hold whatever the predictions say (`Admission`),
then the predicted wait (`wait_refusal`): a request whose answer is not expected within its
class's target or its deadline is refused at once, not served late.

Each class has a bound on its own queue. Normal and batch also have a shedding threshold
on everything queued for the model, all classes together: as the queue grows the batch
class is turned away first (it has the lower threshold), then normal. Realtime is refused
only when its own queue is full. A refused client is told how long to wait from the work
ahead of it and the rate the model has recently been getting through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from deployments.core.admission.throughput import retry_after_s
from deployments.core.admission.wait_predictor import Prediction
from deployments.core.priority import Priority

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
    reason: str  # "shed" (load), "queue_full" (this class's own bound), "wait" (predicted)
    status: int
    retry_after_s: int
    queued_items: int  # for "wait" the work ahead (tokens for the encoders)
    limit: int  # items; for "wait" the budget in ms
    predicted_ms: float | None = None  # "wait" only


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
        wait = retry_after_s(ahead + size, items_per_s, ceiling_s=RETRY_AFTER_CEILING_S)
        return Refusal(reason, refusal_status(priority), wait, ahead, limit)


def refusal_status(priority: Priority) -> int:
    # 429 tells a client to back off and come back; realtime, never shed, gets 503: its
    # bound is the server's capacity, not a share it overdrew.
    return 503 if priority is Priority.REALTIME else 429


def wait_refusal(
    priority: Priority, prediction: Prediction, budget_s: float, ahead_work: int
) -> Refusal | None:
    """None to admit a request predicted to be answered in `prediction.seconds` when it has
    `budget_s` (its class's target or its deadline, the shorter) and `ahead_work` waits
    before it; else a refusal whose Retry-After is the time the excess takes to drain."""
    # Nothing ahead: nothing to wait for but itself, and refusing would never serve it.
    if ahead_work == 0 or prediction.seconds <= budget_s:
        return None
    excess = prediction.seconds - max(budget_s, 0.0)
    retry = int(min(RETRY_AFTER_CEILING_S, max(1, math.ceil(excess))))
    return Refusal(
        "wait",
        refusal_status(priority),
        retry,
        ahead_work,
        round(budget_s * 1e3),
        predicted_ms=round(prediction.seconds * 1e3, 1),
    )
