"""The batches a replica has formed that wait at its gate for a pass, so that a pass that
starts with room in its budget can take some along (core/batching/shared_pass.py).

A waiting batch is either taken by another pass or withdrawn by its own task when the gate
grants it a turn; both happen on the replica's event loop, between awaits, so exactly one
of them wins. A taken batch's task hears at once (`taken`) and gets its results when the
pass that carried it ends (`results`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.batching.cost_model import CostFit
from deployments.core.batching.shared_pass import riders_that_fit
from deployments.core.priority import ALL_PRIORITIES, Priority


@dataclass(eq=False)
class WaitingBatch:
    priority: Priority
    items: list[Any]
    taken: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    results: asyncio.Future[list[Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    gate_turn: asyncio.Future[bool] | None = None  # its own request for a turn at the gate

    def deliver(self, results: list[Any]) -> None:
        if not self.results.done():
            self.results.set_result(results)

    def fail(self, error: BaseException) -> None:
        if self.results.done():
            return
        if isinstance(error, asyncio.CancelledError):
            self.results.cancel()
        else:
            self.results.set_exception(error)


class WaitingBatches:
    def __init__(self) -> None:
        self._waiting: list[WaitingBatch] = []

    def add(self, priority: Priority, items: list[Any]) -> WaitingBatch:
        batch = WaitingBatch(priority, items)
        self._waiting.append(batch)
        return batch

    def withdraw(self, batch: WaitingBatch) -> bool:
        """Takes the batch back for its own pass; False when a pass took it already."""
        if batch.taken.done():
            return False
        self._waiting.remove(batch)
        return True

    def take_along(
        self,
        own: Sequence[Any],
        budget: BatchBudget,
        classes: Sequence[Priority],
        cost: CostFit | None = None,
    ) -> list[WaitingBatch]:
        """The waiting batches of `classes` that fit beside `own` within `budget` and cost
        (the replica's fitted `cost`) no more in one pass than apart, most urgent class first
        and the oldest first within a class; each is marked taken."""
        order = {p: rank for rank, p in enumerate(ALL_PRIORITIES)}
        candidates = sorted(
            (b for b in self._waiting if b.priority in classes),
            key=lambda b: order[b.priority],  # stable: arrival order within a class
        )
        if not candidates:
            return []
        picked = [
            candidates[i] for i in riders_that_fit(own, [b.items for b in candidates], budget, cost)
        ]
        for batch in picked:
            self._waiting.remove(batch)
            batch.taken.set_result(None)
        return picked

    def counts(self) -> dict[str, int]:
        return {p.label: sum(b.priority is p for b in self._waiting) for p in ALL_PRIORITIES}
