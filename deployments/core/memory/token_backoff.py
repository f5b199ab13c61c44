"""The token budget a replica's memory allows: a ceiling measured at warm-up, and after an
out-of-memory pass a cap halved at once and given back a step at a time.

Multiplicative decrease and additive increase, as TCP does with a congestion window: one
fault says the last budget was too big, so the next passes stay at half the size that failed;
every pass that then succeeds earns back `step` tokens, until the cap is out of the way. The
ceiling (`core/memory/token_ceiling.py`, from the warm-up probe) is where the climb stops, and it
holds with no fault at all. Both are per replica (memory is), and the tuner applies `limit()`
under every class's budget, so no plan is ever larger.
"""

from __future__ import annotations


class TokenBackoff:
    def __init__(self, floor: int = 16, step: int = 64) -> None:
        self.floor = floor
        self.step = step
        self.cap: int | None = None  # None: no fault to remember, the ceilings decide
        self.ceiling: int | None = None  # None: memory was not measured, or bounds nothing

    def limit(self) -> int | None:
        """The most padded tokens any pass may have now; None: memory bounds nothing."""
        bounds = [b for b in (self.cap, self.ceiling) if b is not None]
        return min(bounds) if bounds else None

    def fault(self, padded_tokens: int) -> None:
        """A pass of `padded_tokens` ran out of memory."""
        limit = self.limit()
        current = padded_tokens if limit is None else min(limit, padded_tokens)
        self.cap = max(self.floor, current // 2)

    def success(self, ceiling: int) -> None:
        """A pass ran; `ceiling` is the largest budget any class is configured for."""
        if self.cap is None:
            return
        self.cap += self.step
        top = ceiling if self.ceiling is None else min(ceiling, self.ceiling)
        if self.cap >= top:
            self.cap = None
