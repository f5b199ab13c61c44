"""One batch queue per priority class, and the plans that size them.

Each class's items go through a queue of Serve's own `@serve.batch`, which forms batches
capped by count and by padded tokens (each item's `BatchBudget`, read by `budget_size`) with
the class's own wait. The batch tuner (core/batching/batch_tuner.py) chooses each class's
size, token budget and wait from the configured limits and what the passes teach it;
`retune` hands its current plans to the queues and the budgets.

The queues are built per instance over a plain function each rather than as decorated
methods: Serve keeps a decorated method's queue on the function, shared by every instance in
the process, and fixes its concurrency when the class is defined. Built here, a queue runs
as many batches side by side as the replica runs passes. Serve creates the queue itself on
the first item, in the replica's event loop; until then its setters only keep the values.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ray import serve

from deployments.config.base import ModelBatching
from deployments.core.batching.batch_budget import BatchBudget, budget_size
from deployments.core.batching.batch_policy import BatchPlan, ClassLimits
from deployments.core.batching.batch_tuner import BatchTuner
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import ALL_PRIORITIES, Priority

# What a queue does with a batch it formed: the forward pass, one result per item.
OnBatch = Callable[[Priority, list[Any]], Awaitable[list[Any]]]


class BatchQueues:
    def __init__(
        self,
        name: str,
        batching: ModelBatching,
        on_batch: OnBatch,
        passes: int,
        metrics: TributaryMetrics,
        realtime_extra: int = 0,
    ) -> None:
        """`name` labels the metrics; `passes`: batches of one class that may be formed and
        not yet done at once (running, or waiting at the gate for a pass); the realtime
        class `realtime_extra` more (its lane)."""
        self._name = name
        self._metrics = metrics
        self.tuner = BatchTuner([p.label for p in ALL_PRIORITIES])
        self._budgets = {p: BatchBudget(1, 1) for p in ALL_PRIORITIES}
        # Serve's batch wrappers; Ray's stubs do not show their set_* methods.
        self._queues: dict[Priority, Any] = {
            p: _serve_queue(p, on_batch, passes + (realtime_extra if p is Priority.REALTIME else 0))
            for p in ALL_PRIORITIES
        }
        self._plans: dict[Priority, BatchPlan] = {}
        self.batching = batching
        self.reconfigure(batching)

    def queue(self, priority: Priority) -> Callable[[Any], Awaitable[Any]]:
        """The class's queue: awaiting it with an item gives that item's result."""
        return self._queues[priority]

    def budget(self, priority: Priority) -> BatchBudget:
        """The budget the class's items carry: Serve's queue sizes batches by it."""
        return self._budgets[priority]

    def reconfigure(self, batching: ModelBatching) -> None:
        """New configured limits per class; every class gets its new plan, changed or not."""
        self.batching = batching
        limits: dict[str, ClassLimits] = {}
        for priority in ALL_PRIORITIES:
            settings = batching.of(priority.label)
            target = settings.target_p99_ms
            limits[priority.label] = ClassLimits(
                max_batch_size=settings.max_batch_size,
                max_batch_tokens=settings.max_batch_tokens,
                wait_s=settings.batch_wait_timeout_s,
                target_s=None if target is None else target / 1e3,
                alone_max_batch_tokens=settings.alone_max_batch_tokens,
                alone_max_pass_s=settings.alone_max_pass_ms / 1e3,
            )
        self.tuner.configure(limits, batching.adaptive)
        self._plans.clear()
        self.retune()

    def arrived(self, priority: Priority, items: int, company: bool) -> None:
        """`items` of the class are about to be queued (`company`: not alone in it)."""
        self.tuner.arrived(priority.label, items, company)
        self.retune()

    def retune(self) -> None:
        """Hands each class the batch size, token budget and wait the tuner now chooses;
        Serve's queue reads them when its next batch starts forming."""
        plans = self.tuner.plans()
        for priority in ALL_PRIORITIES:
            plan = plans[priority.label]
            if self._plans.get(priority) == plan:
                continue
            self._plans[priority] = plan
            budget = self._budgets[priority]
            budget.max_batch_size = plan.max_batch_size
            budget.max_batch_tokens = plan.max_batch_tokens
            self._queues[priority].set_max_batch_size(plan.max_batch_size)
            self._queues[priority].set_batch_wait_timeout_s(plan.wait_s)
            self._metrics.batch_plan(self._name, priority.label, plan.max_batch_tokens, plan.wait_s)

    def plans_report(self) -> dict[str, Any]:
        return {p.label: plan.report() for p, plan in self._plans.items()}


def _serve_queue(priority: Priority, on_batch: OnBatch, passes: int) -> Any:
    async def batch(items: list[Any]) -> list[Any]:
        return await on_batch(priority, items)

    # Serve labels its batch metrics by the function's name: the names the class's
    # decorated methods had.
    batch.__name__ = batch.__qualname__ = f"_batch_{priority.label}"
    # The size and wait are placeholders: the first `retune` sets the class's plan before
    # any item arrives.
    return serve.batch(
        max_batch_size=1,
        batch_wait_timeout_s=0.0,
        max_concurrent_batches=passes,
        batch_size_fn=budget_size,
    )(batch)
