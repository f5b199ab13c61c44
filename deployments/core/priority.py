"""Priority classes. Lower value = served first."""

from __future__ import annotations

from enum import IntEnum
from typing import Literal, cast

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
