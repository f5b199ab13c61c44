"""Fakes shared by the fast tests."""

from __future__ import annotations


class Clock:
    """A monotonic clock the test moves by hand: set `now`, or add to it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
