"""What a forward pass costs on this replica, fitted online from the passes it ran.

A replica records every batch it runs (rows, padded tokens, seconds) and fits
seconds ~ intercept + per_row x rows + per_token x padded_tokens over a recent window by
least squares. The intercept is the per-call overhead that makes batch 1 expensive; the
per-token slope is what a bigger batch costs. The batch policy (`batch_policy`) asks the fit
how many padded tokens fit in a time slot; `/v1/stats` and the metrics show it.

The window forgets old passes, so the fit follows a replica whose speed changes (a runtime
warming up, a neighbour taking the CPU). No coefficient is ever negative: a term the data
cannot support is dropped and the rest refitted, so a prediction never shrinks as a batch
grows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Fewer passes than this, or passes of too few distinct sizes, give no fit.
MIN_SAMPLES = 8


@dataclass(frozen=True)
class CostFit:
    intercept_s: float
    per_row_s: float
    per_token_s: float
    samples: int

    def predict_s(self, rows: int, padded_tokens: int) -> float:
        return self.intercept_s + self.per_row_s * rows + self.per_token_s * padded_tokens

    def tokens_within(self, seconds: float, tokens_per_row: float) -> int:
        """The most padded tokens a pass of rows of `tokens_per_row` tokens each may hold
        and still be predicted to end within `seconds` (0 when not even the intercept fits)."""
        per_token = self.per_token_s + self.per_row_s / max(tokens_per_row, 1.0)
        room = seconds - self.intercept_s
        if room <= 0:
            return 0
        if per_token <= 0:
            return 1 << 30  # the data shows no cost per token: the ceilings decide
        return int(room / per_token * (1 + 1e-9))  # 179.999... is 180

    def report(self) -> dict[str, float | int]:
        return {
            "intercept_ms": round(self.intercept_s * 1e3, 3),
            "per_row_ms": round(self.per_row_s * 1e3, 4),
            "per_1k_tokens_ms": round(self.per_token_s * 1e6, 3),
            "samples": self.samples,
        }


class CostModel:
    def __init__(self, window: int = 256, refit_every: int = 8) -> None:
        self._passes: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._refit_every = refit_every
        self._since_fit = 0
        self._fit: CostFit | None = None

    def observe(self, rows: int, padded_tokens: int, seconds: float) -> None:
        if rows <= 0 or seconds < 0:
            return
        self._passes.append((rows, padded_tokens, seconds))
        self._since_fit += 1
        if self._fit is None or self._since_fit >= self._refit_every:
            self._fit = fit(list(self._passes))
            self._since_fit = 0

    @property
    def current(self) -> CostFit | None:
        return self._fit


def fit(passes: list[tuple[int, int, float]]) -> CostFit | None:
    """Least squares over the terms the data supports, each coefficient >= 0."""
    if len(passes) < MIN_SAMPLES:
        return None
    terms = [0, 1, 2]  # intercept, rows, tokens
    while terms:
        coefficients = _least_squares(passes, terms)
        if coefficients is None:
            # Singular: the remaining terms are not told apart by this data (every pass
            # of one size, say). Drop the rows term first, then the intercept.
            terms.remove(1 if 1 in terms else terms[0])
            continue
        negative = [term for term, value in zip(terms, coefficients, strict=True) if value < 0]
        if not negative:
            full = dict(zip(terms, coefficients, strict=True))
            return CostFit(full.get(0, 0.0), full.get(1, 0.0), full.get(2, 0.0), len(passes))
        terms.remove(negative[0])
    return None


def _least_squares(passes: list[tuple[int, int, float]], terms: list[int]) -> list[float] | None:
    columns = [[(1.0, float(p[0]), float(p[1]))[t] for p in passes] for t in terms]
    # Each column scaled to unit RMS: tokens run to thousands and the intercept's column is
    # ones, and an unscaled system would look singular when it is not.
    scales = [(sum(v * v for v in col) / len(col)) ** 0.5 or 1.0 for col in columns]
    scaled = [[v / s for v in col] for col, s in zip(columns, scales, strict=True)]
    seconds = [p[2] for p in passes]
    n = len(terms)

    def dot(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    normal = [[dot(scaled[i], scaled[j]) for j in range(n)] for i in range(n)]
    rhs = [dot(scaled[i], seconds) for i in range(n)]
    solved = _solve(normal, rhs, tolerance=1e-9 * len(passes))
    if solved is None:
        return None
    return [c / s for c, s in zip(solved, scales, strict=True)]


def _solve(matrix: list[list[float]], rhs: list[float], tolerance: float) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when (nearly) singular."""
    n = len(rhs)
    a = [[*row, rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= tolerance:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                for c in range(col, n + 1):
                    a[r][c] -= factor * a[col][c]
    return [a[i][n] / a[i][i] for i in range(n)]
