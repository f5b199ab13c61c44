"""The guard of a canary: stop its traffic by itself when it does worse than the primary.

Per model, each version's recent answers (ok or failed, latency) are kept for a window;
after each one the guard compares every canary with the primary. A canary whose error
rate exceeds the primary's by more than the margin, whose p99 exceeds the primary's by
more than the ratio, or whose shadow agreement falls below the floor, is tripped: the
ingress gives it weight 0 until an operator re-arms it. Pure: the clock is passed in.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GuardRules:
    window_s: float = 60.0
    min_requests: int = 20  # of the canary (and the primary) in the window before judging
    max_error_rate_increase: float | None = 0.05
    max_p99_ratio: float | None = 2.0
    min_agreement: float | None = None  # mean shadow agreement over the window


@dataclass(frozen=True)
class Trip:
    version: str
    reason: str  # error_rate, p99 or agreement
    detail: str
    at: float


@dataclass
class _Window:
    answers: deque[tuple[float, bool, float]] = field(default_factory=deque)
    agreements: deque[tuple[float, float]] = field(default_factory=deque)

    def trim(self, oldest: float) -> None:
        while self.answers and self.answers[0][0] < oldest:
            self.answers.popleft()
        while self.agreements and self.agreements[0][0] < oldest:
            self.agreements.popleft()

    def error_rate(self) -> float:
        return sum(1 for _, ok, _ in self.answers if not ok) / max(1, len(self.answers))

    def p99(self) -> float:
        latencies = sorted(latency for _, ok, latency in self.answers if ok)
        if not latencies:
            return 0.0
        return latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]

    def mean_agreement(self) -> float | None:
        if not self.agreements:
            return None
        return sum(value for _, value in self.agreements) / len(self.agreements)


class RolloutGuard:
    def __init__(
        self, rules: GuardRules, primary: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rules = rules
        self.primary = primary
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self.tripped: dict[str, Trip] = {}

    def record(self, version: str, ok: bool, latency_s: float) -> Trip | None:
        now = self._clock()
        self._window(version).answers.append((now, ok, latency_s))
        return self._judge(version, now)

    def record_agreement(self, version: str, value: float) -> Trip | None:
        now = self._clock()
        self._window(version).agreements.append((now, value))
        return self._judge(version, now)

    def snapshot(self) -> dict[str, dict[str, object]]:
        now = self._clock()
        shown: dict[str, dict[str, object]] = {}
        for version, window in self._windows.items():
            window.trim(now - self.rules.window_s)
            trip = self.tripped.get(version)
            shown[version] = {
                "requests": len(window.answers),
                "error_rate": round(window.error_rate(), 4),
                "p99_ms": round(1000 * window.p99(), 2),
                "agreement": window.mean_agreement(),
                "tripped": None if trip is None else {"reason": trip.reason, "detail": trip.detail},
            }
        return shown

    def _window(self, version: str) -> _Window:
        return self._windows.setdefault(version, _Window())

    def _judge(self, version: str, now: float) -> Trip | None:
        if version == self.primary or version in self.tripped:
            return None
        rules = self.rules
        canary = self._window(version)
        primary = self._window(self.primary)
        canary.trim(now - rules.window_s)
        primary.trim(now - rules.window_s)
        trip = self._agreement_trip(version, canary, now)
        enough = min(len(canary.answers), len(primary.answers)) >= rules.min_requests
        if trip is None and enough:
            trip = self._answer_trip(version, canary, primary, now)
        if trip is not None:
            self.tripped[version] = trip
        return trip

    def _agreement_trip(self, version: str, canary: _Window, now: float) -> Trip | None:
        floor = self.rules.min_agreement
        agreement = canary.mean_agreement()
        if floor is None or agreement is None or len(canary.agreements) < self.rules.min_requests:
            return None
        if agreement >= floor:
            return None
        return Trip(version, "agreement", f"mean shadow agreement {agreement:.4f} < {floor}", now)

    def _answer_trip(
        self, version: str, canary: _Window, primary: _Window, now: float
    ) -> Trip | None:
        rules = self.rules
        errors, baseline = canary.error_rate(), primary.error_rate()
        margin = rules.max_error_rate_increase
        if margin is not None and errors > baseline + margin:
            detail = f"error rate {errors:.3f} > primary {baseline:.3f} + {margin}"
            return Trip(version, "error_rate", detail, now)
        if rules.max_p99_ratio is not None:
            p99, base_p99 = canary.p99(), primary.p99()
            if base_p99 > 0 and p99 > base_p99 * rules.max_p99_ratio:
                detail = (
                    f"p99 {1000 * p99:.1f} ms > {rules.max_p99_ratio} x primary "
                    f"{1000 * base_p99:.1f} ms"
                )
                return Trip(version, "p99", detail, now)
        return None
