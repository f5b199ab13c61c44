"""What a replica's info reports of its forward passes: batches and items, overall and per
class, the items dropped before a pass by reason, and the last requests that lost some.

Per class, `batches` are the passes the class led and `items` its own inputs in them;
`carried_items` are its inputs that rode in a pass another batch led (of its own class or
another), `carried_batches` how many of its batches did, `riders_items` the inputs of other
waiting batches its passes took along (a normal pass takes other normal batches too).
`mean_batch_size` is the mean size of the passes it led, riders included."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from deployments.core.priority import ALL_PRIORITIES, Priority
from deployments.replicas.batched.batched_jobs import BatchItem, Dropped

RECENT_DROPS = 256  # requests the drop ledger remembers


class PassCounters:
    def __init__(self) -> None:
        self._totals = {"batches": 0, "items": 0, "expired_items": 0, "client_gone_items": 0}
        self._classes = {
            p: dict.fromkeys(
                ("batches", "items", "carried_batches", "carried_items", "riders_items"), 0
            )
            for p in ALL_PRIORITIES
        }
        self._recent_drops: deque[dict[str, str]] = deque(maxlen=RECENT_DROPS)

    def ran(
        self, priority: Priority, items: int, carried: Sequence[tuple[Priority, int]] = ()
    ) -> None:
        """A pass of `items` live items of the class, and per batch it took along, that
        batch's class and live items."""
        riders = sum(count for _, count in carried)
        self._totals["batches"] += 1
        self._totals["items"] += items + riders
        self._classes[priority]["batches"] += 1
        self._classes[priority]["items"] += items
        self._classes[priority]["riders_items"] += riders
        for klass, count in carried:
            self._classes[klass]["carried_batches"] += 1
            self._classes[klass]["carried_items"] += count

    def dropped(
        self, marks: Sequence[Dropped | None], items: Sequence[BatchItem]
    ) -> dict[str, int]:
        """A batch's items that were dropped (`marks`, per item); returns how many by
        reason. A request is remembered once, however many of its items went."""
        noted: set[int] = set()
        by_reason: dict[str, int] = {}
        for mark, item in zip(marks, items, strict=True):
            if mark is None:
                continue
            self._totals[f"{mark.reason}_items"] += 1
            by_reason[mark.reason] = by_reason.get(mark.reason, 0) + 1
            if id(item.state) not in noted:
                noted.add(id(item.state))
                self._recent_drops.append(
                    {"request_id": item.state.request_id, "reason": mark.reason}
                )
        return by_reason

    def report(self) -> dict[str, Any]:
        """The totals, their mean batch size, and the same per class."""
        batches, items = self._totals["batches"], self._totals["items"]
        return {
            **self._totals,
            "mean_batch_size": items / batches if batches else 0.0,
            "classes": {
                p.label: {
                    **counts,
                    "mean_batch_size": (counts["items"] + counts["riders_items"])
                    / counts["batches"]
                    if counts["batches"]
                    else 0.0,
                }
                for p, counts in self._classes.items()
            },
        }

    def recent_drops(self) -> list[dict[str, str]]:
        return list(self._recent_drops)
