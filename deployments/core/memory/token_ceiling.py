"""A replica's token ceiling from memory it measured: the warm-up probe as pure logic.

At warm-up a replica runs passes of growing padded size and reads what each one took at its
peak (`measure(padded_tokens) -> bytes`: on a GPU torch's peak allocation above what was
allocated before the pass, on a CPU the process's peak RSS above its RSS before). Sizes
double from one window's worth; before each step the fit so far predicts the next pass, and
the probe stops when that pass would need more than `margin` of `allowed_bytes` (a fraction
of the GPU's free memory, or the configured CPU budget) or when it reaches `max_tokens` (the
largest budget any class may use, so warm-up never runs a pass the replica would not run
later).

The measured points are fitted as bytes ~ base + per_token x padded tokens, and the ceiling
is the padded size whose predicted bytes are `margin` of what is allowed. The margin covers
what the fit does not see, for the probe's own steps as for the ceiling: a cost per token
that grows at larger sizes (once, on a CPU, MiniLM's 16,384-token pass peaked at 570 MB where
the fit over the smaller passes had put it under the 524 MB allowed), fragmentation, noise in
the measure.

Kept free of torch and of the clock, so tests drive it with a fake device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# A pass's predicted bytes may use this much of what is allowed; the rest is slack for
# what a straight line over a few points misses.
DEFAULT_MARGIN = 0.9
# Enough points for a fit with an intercept; more only lengthen warm-up.
MAX_STEPS = 12


@dataclass(frozen=True)
class ProbePoint:
    padded_tokens: int
    peak_bytes: int


@dataclass(frozen=True)
class TokenCeiling:
    """What the probe measured and the ceiling it chose (None: memory bounds nothing)."""

    tokens: int | None
    allowed_bytes: int
    base_bytes: float
    per_token_bytes: float
    points: tuple[ProbePoint, ...]
    why: str

    def report(self) -> dict[str, object]:
        return {
            "token_ceiling": self.tokens,
            "allowed_bytes": self.allowed_bytes,
            "fit": {
                "base_bytes": round(self.base_bytes),
                "per_token_bytes": round(self.per_token_bytes, 1),
            },
            "points": [[p.padded_tokens, p.peak_bytes] for p in self.points],
            "why": self.why,
        }


def fit_line(points: list[ProbePoint]) -> tuple[float, float]:
    """Least squares bytes ~ base + per_token x tokens; through the origin from one point.
    Neither term is let below zero: a negative base would promise more room at large sizes
    than was measured."""
    if not points:
        return 0.0, 0.0
    if len(points) == 1 or len({p.padded_tokens for p in points}) == 1:
        (one, *_) = points
        return 0.0, max(p.peak_bytes for p in points) / max(one.padded_tokens, 1)
    n = len(points)
    mean_t = sum(p.padded_tokens for p in points) / n
    mean_b = sum(p.peak_bytes for p in points) / n
    var = sum((p.padded_tokens - mean_t) ** 2 for p in points)
    cov = sum((p.padded_tokens - mean_t) * (p.peak_bytes - mean_b) for p in points)
    slope = cov / var
    base = mean_b - slope * mean_t
    if base < 0 or slope <= 0:
        # Through the origin instead, from the steepest point: never below what one
        # measured pass cost per token.
        return 0.0, max(p.peak_bytes / p.padded_tokens for p in points)
    return base, slope


def probe_ceiling(
    measure: Callable[[int], int],
    allowed_bytes: int,
    start_tokens: int,
    max_tokens: int,
    margin: float = DEFAULT_MARGIN,
    is_fault: Callable[[BaseException], bool] = lambda error: False,
) -> TokenCeiling:
    """Runs the probe. `start_tokens` is one full window (one row); every step doubles
    the rows. A pass that raises a memory fault (`is_fault`) ends the probe, and the
    ceiling stays below the size that failed."""
    points: list[ProbePoint] = []
    size = start_tokens = max(start_tokens, 1)
    # Whole rows only: the replica runs `size // start_tokens` full rows, so a size that is
    # not a multiple would be recorded larger than the pass that was measured.
    top = max(max_tokens // start_tokens, 1) * start_tokens
    failed_at: int | None = None
    stop = "reached the largest configured budget"
    for _ in range(MAX_STEPS):
        if points:
            base, per_token = fit_line(points)
            if base + per_token * size > margin * allowed_bytes:
                stop = f"the next step ({size} tokens) would pass {margin:.0%} of the allowed bytes"
                break
        try:
            peak = measure(size)
        except Exception as error:
            if not is_fault(error):
                raise
            failed_at = size
            stop = f"a pass of {size} tokens ran out of memory"
            break
        points.append(ProbePoint(size, max(int(peak), 0)))
        if peak > allowed_bytes:
            stop = f"a pass of {size} tokens passed the allowed bytes"
            break
        if size >= top:
            break
        size = min(size * 2, top)
    base, per_token = fit_line(points)
    if per_token <= 0:
        return TokenCeiling(
            None, allowed_bytes, base, per_token, tuple(points), f"{stop}; no growth measured"
        )
    tokens = int((allowed_bytes * margin - base) / per_token)
    why = f"{stop}; fit to {margin:.0%} of the allowed bytes"
    if failed_at is not None and tokens >= failed_at:
        tokens = max(p.padded_tokens for p in points) if points else start_tokens
        why = f"{stop}; the largest pass that ran"
    if tokens < start_tokens:
        # One item runs alone whatever the budget says (it cannot be split); a ceiling
        # below one window would only say so less clearly.
        tokens = start_tokens
        why = f"{stop}; the budget is below one window: one window per pass"
    return TokenCeiling(tokens, allowed_bytes, base, per_token, tuple(points), why)


def gpu_allowance(
    free_bytes: int,
    cached_bytes: int,
    fraction: float,
    fence_room_bytes: int | None = None,
    budget_bytes: int | None = None,
) -> tuple[int, str]:
    """What a GPU probe may use, and why: `fraction` of the memory free for this process
    (the card's free memory plus what torch holds cached but unused, which it reuses
    first), never more than the room under a `gpu_memory_fraction` fence or a configured
    budget."""
    allowed = int(fraction * (free_bytes + cached_bytes))
    why = f"{fraction:g} of free device memory"
    if fence_room_bytes is not None and fence_room_bytes < allowed:
        allowed, why = max(fence_room_bytes, 0), "room under gpu_memory_fraction"
    if budget_bytes is not None and budget_bytes < allowed:
        allowed, why = budget_bytes, "memory_budget_mib"
    return allowed, why
