"""The token budget after an out-of-memory pass: halved at once, given back a step at a time.

Multiplicative decrease and additive increase, as TCP does with a congestion window: one
fault says the last budget was too big, so the next passes stay at half the size that failed;
every pass that then succeeds earns back `step` tokens, until the cap is out of the way. The
cap is per replica (memory is), and the batch policy applies it under every class's budget.
"""

from __future__ import annotations


class TokenBackoff:
    def __init__(self, floor: int = 16, step: int = 64) -> None:
        self.floor = floor
        self.step = step
        self.cap: int | None = None  # None: no fault to remember, the ceilings decide

    def fault(self, padded_tokens: int) -> None:
        """A pass of `padded_tokens` ran out of memory."""
        current = padded_tokens if self.cap is None else min(self.cap, padded_tokens)
        self.cap = max(self.floor, current // 2)

    def success(self, ceiling: int) -> None:
        """A pass ran; `ceiling` is the largest budget any class is configured for."""
        if self.cap is None:
            return
        self.cap += self.step
        if self.cap >= ceiling:
            self.cap = None
