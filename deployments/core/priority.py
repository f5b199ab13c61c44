"""Priority classes (lower value = served first), and the aged pick among their queues
that both the replica's gate and the generation slots use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import Literal, Protocol, TypeVar, cast

# A class by its name, as configs and headers spell it.
PriorityName = Literal["realtime", "normal", "batch"]


class Priority(IntEnum):
    REALTIME = 0
    NORMAL = 1
    BATCH = 2

    @property
    def label(self) -> PriorityName:
        return cast(PriorityName, self.name.lower())

    @classmethod
    def parse(cls, name: str) -> Priority:
        """The class called `name` (case-insensitive); ValueError names the choices."""
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(
                f"unknown priority {name!r}; use one of {', '.join(p.label for p in cls)}"
            ) from None

    def capped_at(self, tier: Priority) -> Priority:
        """This class, or `tier` when this one asks for more than the tier allows."""
        return max(self, tier)


ALL_PRIORITIES: tuple[Priority, ...] = tuple(Priority)


class Waiting(Protocol):
    """Anything waiting its turn in a class queue: a batch at the gate, a sequence for a slot."""

    @property
    def priority(self) -> Priority: ...

    @property
    def since(self) -> float: ...


W = TypeVar("W", bound=Waiting)


def has_aged(waiting: Waiting, aged_after_s: Mapping[Priority, float | None], now: float) -> bool:
    """Whether it has waited its class's `aged_after_s` (never, for a class without one)."""
    limit = aged_after_s.get(waiting.priority)
    return limit is not None and now - waiting.since >= limit


def next_in_line(
    queues: Mapping[Priority, Sequence[W]],
    aged_after_s: Mapping[Priority, float | None],
    now: float,
) -> tuple[W | None, bool]:
    """The queue head to serve next, and whether ageing put it ahead of a higher class.

    The head of the highest class goes first, except that a head whose class has an
    `aged_after_s` and that has waited that long goes before it (the oldest such head when
    there are several): lower classes slow down under load, but never starve. Only heads
    are considered, so nothing in a queue is passed over for something behind it."""
    aged = [
        queue[0] for queue in queues.values() if queue and has_aged(queue[0], aged_after_s, now)
    ]
    if aged:
        oldest = min(aged, key=lambda waiting: waiting.since)
        return oldest, oldest.priority != min(p for p, q in queues.items() if q)
    for priority in ALL_PRIORITIES:
        queue = queues.get(priority)
        if queue:
            return queue[0], False
    return None, False
