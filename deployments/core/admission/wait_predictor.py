"""How long a request would take if admitted now, learned from what admitted requests took.

The queue term of a request is the work ahead of it and its own, divided by the model's
service rate: q = (work ahead + its work) / work a second. Work is in whatever unit the
caller weighs jobs by: tokens for the encoders (`job_work.py`). What a request really takes
is that and more: the hop and one pass however short the queue, a pass of another class it
sits behind, an ingress whose CPU is taken. So each class fits, over the requests it
admitted in the last 30 s (at least its last 32), measured = base + slope x q by least
squares (the slope between 0.5 and 8, the base at least 0), and predicts base + slope x q +
the residuals' 90th percentile: the time about nine in ten such requests beat. Each second
of that history weighs the same however many requests it admitted, and the weight of a
second halves in under 3 s (`LatencyFit`), so that what a cold start, a stall or a flood
taught is forgotten once it is over; at least the last 32, so that a class that admits
little keeps its latest evidence; a quantile, not a multiple of the standard deviation, so
that a few answers held up by a stall do not widen the margin past most waits.

A fit, not a single correction factor, because the two errors differ in kind: a rate
measured too high stretches long queues more than short ones (the slope), while a busy
ingress or a hop adds the same to every request (the base). A factor alone, tried first,
grew to 16 on a machine whose CPU others took, and then refused every request that found
anything at all ahead of it while the model stood idle.

The service rate is the better of two measures. The replica's own capacity (`set_capacity`:
inputs a second in full passes, from the cost model it fits to its passes) times the work
of an input as this ingress weighs them; and the rate measured here (`busy_rate`: work
answered per busy second). The measured one shows what the model can do only once it has
been saturated: on a model that has served a trickle, 64 clients arriving at once were
refused at the trickle's rate. The capacity is known after the replica's first few passes
of different sizes; until then the measured rate serves. The fit takes care of a capacity
the model cannot reach here (a neighbour on the device, an ingress short of CPU): its
answers come late and its slope rises.

Until a class has a fit the prediction is the fastest recent call (the hop and a pass) plus
q. Before either rate is known (a fresh ingress, a model not yet busy for a second) q is
taken at COLD_START_WORK_PER_S, a slow CPU's rate: with the fixed bounds alone a flood on a
fresh server queued seconds of work (a soak's first minute: p50 6.6 s, realtime requests
past their 10 s deadline). Such predictions teach the fit nothing: their q is a guess.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from deployments.core.admission.busy_rate import BusyRate
from deployments.core.priority import ALL_PRIORITIES, Priority

MIN_SLOPE, MAX_SLOPE = 0.5, 8.0
TAIL = 0.9  # the margin is this quantile of the residuals
# A fit learns from the requests of the last this many seconds only: what an overload or a
# cold start taught must not outlive it, or a class whose admissions it throttles would
# take many minutes to collect the samples that undo it.
FIT_MAX_AGE_S = 30.0
# Work a second assumed before any is measured: ~100 short texts a second, what MiniLM does
# on one slow core. A second or so later the measured rate takes over.
COLD_START_WORK_PER_S = 2000.0
# The fit's bins, how fast an old bin's weight fades, how many samples of a bin the margin
# looks at, and how old a fit may get while samples keep coming.
BIN_S = 1.0
TIME_CONSTANT_S = 4.0
KEPT_PER_BIN = 32
STALE_FIT_S = 0.5
# A fit runs on the ingress's event loop: under a flood (hundreds of admissions a second)
# it is redone at most this often, or every REFIT_AT_MOST samples, whichever comes first
# (refits every 16 admissions were 8 % of a flooded ingress's samples; one is ~0.2 ms).
REFIT_GAP_S = 0.1
REFIT_AT_MOST = 64


@dataclass(frozen=True)
class Prediction:
    seconds: float  # what admission compares with the request's budget
    queue_s: float  # q, the queue term: what the fit learns the measured latency from
    cold: bool = False  # q at the assumed rate, before any was known


@dataclass(frozen=True)
class LatencyLine:
    base_s: float
    slope: float
    spread_s: float  # the margin: the residuals' 90th percentile (0 at least)

    def predict_s(self, queue_s: float) -> float:
        return self.base_s + self.slope * queue_s + self.spread_s


class LatencyFit:
    """measured ~ base + slope x q over the admitted requests of a class, weighing time,
    not requests: the samples go into bins of BIN_S, each bin weighs the same however many
    requests it holds, and older bins weigh less (e-fold every TIME_CONSTANT_S). Counted by
    requests, a fit over the last few hundred covered under a second in a flood, and once it
    had taught admission to refuse nearly everything the few requests still admitted took
    many seconds to outweigh it: admission swung between admitting a flood and refusing
    everything (normal admissions at 24 a second for 3 s, then 300). Only the last
    `max_age_s` count, or the last `min_samples` where fewer came since."""

    def __init__(
        self,
        min_samples: int = 32,
        refit_every: int = 16,
        max_age_s: float = FIT_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bins: deque[_Bin] = deque()
        self._latest: deque[tuple[float, float]] = deque(maxlen=min_samples)
        self._min_samples = min_samples
        self._refit_every = refit_every
        self._max_age_s = max_age_s
        self._clock = clock
        self._since_fit = 0
        self._fitted_at = -math.inf
        self._line: LatencyLine | None = None

    @property
    def line(self) -> LatencyLine | None:
        """The current fit, refitted once it is STALE_FIT_S old and samples came since (a
        class admitting little must not keep a fit that stopped it), or `max_age_s` old;
        None before `min_samples` were observed."""
        now = self._clock()
        age = now - self._fitted_at
        if self._line is not None and (
            (self._since_fit and age > STALE_FIT_S) or age > self._max_age_s
        ):
            self._refit(now)
        return self._line

    def observe(self, queue_s: float, measured_s: float) -> None:
        now = self._clock()
        start = now - now % BIN_S
        if not self._bins or self._bins[-1].start != start:
            self._bins.append(_Bin(start))
        self._bins[-1].add(queue_s, measured_s)
        self._latest.append((queue_s, measured_s))
        self._since_fit += 1
        due = self._since_fit >= REFIT_AT_MOST or (
            self._since_fit >= self._refit_every and now - self._fitted_at >= REFIT_GAP_S
        )
        if len(self._latest) >= self._min_samples and due:
            self._refit(now)

    def _refit(self, now: float) -> None:
        while self._bins and now - self._bins[0].start > self._max_age_s:
            self._bins.popleft()
        if sum(b.count for b in self._bins) >= self._min_samples:
            weighted = [(b, math.exp(-(now - b.start) / TIME_CONSTANT_S)) for b in self._bins]
            self._line = fit_bins(weighted)
        elif len(self._latest) >= self._min_samples:
            # A class that admits little (the fit itself may be why) keeps its latest
            # evidence rather than falling back to the optimistic floor-plus-queue.
            self._line = fit_line(list(self._latest))
        else:
            self._line = None
        self._fitted_at, self._since_fit = now, 0


class _Bin:
    """One BIN_S of samples: the sums a least-squares line needs, and a uniform sample of
    up to KEPT_PER_BIN of them for the margin's quantile."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0
        self.sum_q = self.sum_m = self.sum_qq = self.sum_qm = 0.0
        self.kept: list[tuple[float, float]] = []

    def add(self, q: float, m: float) -> None:
        self.count += 1
        self.sum_q += q
        self.sum_m += m
        self.sum_qq += q * q
        self.sum_qm += q * m
        if len(self.kept) < KEPT_PER_BIN:
            self.kept.append((q, m))
        else:  # reservoir sampling: every sample of the bin equally likely to be kept
            slot = random.randrange(self.count)
            if slot < KEPT_PER_BIN:
                self.kept[slot] = (q, m)


def fit_bins(bins: list[tuple[_Bin, float]]) -> LatencyLine:
    """The line over `bins`, each (bin, its weight), a bin's weight shared by its samples."""
    total = sum(weight for _, weight in bins)
    mean_q = sum(w * b.sum_q / b.count for b, w in bins) / total
    mean_m = sum(w * b.sum_m / b.count for b, w in bins) / total
    var_q = sum(w * b.sum_qq / b.count for b, w in bins) / total - mean_q**2
    cov = sum(w * b.sum_qm / b.count for b, w in bins) / total - mean_q * mean_m
    base, slope = _base_and_slope(mean_q, mean_m, var_q, cov)
    residuals = sorted((m - base - slope * q, w / len(b.kept)) for b, w in bins for q, m in b.kept)
    return LatencyLine(base, slope, max(_weighted_quantile(residuals, TAIL), 0.0))


def _base_and_slope(mean_q: float, mean_m: float, var_q: float, cov: float) -> tuple[float, float]:
    # Queues all of one length say nothing of the slope: take the rate at its word.
    slope = cov / var_q if var_q > 1e-12 else 1.0
    slope = min(max(slope, MIN_SLOPE), MAX_SLOPE)
    return max(mean_m - slope * mean_q, 0.0), slope


def _weighted_quantile(ordered: list[tuple[float, float]], quantile: float) -> float:
    total = sum(weight for _, weight in ordered)
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= quantile * total:
            return value
    return ordered[-1][0]


def fit_line(samples: list[tuple[float, float]]) -> LatencyLine:
    n = len(samples)
    mean_q = sum(q for q, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var_q = sum((q - mean_q) ** 2 for q, _ in samples) / n
    cov = sum((q - mean_q) * (m - mean_m) for q, m in samples) / n
    base, slope = _base_and_slope(mean_q, mean_m, var_q, cov)
    # A quantile, not a multiple of the standard deviation: a few answers held up by a
    # stall would make the deviation, and the margin, larger than most waits.
    residuals = sorted(m - base - slope * q for q, m in samples)
    margin = residuals[min(n - 1, int(TAIL * n))]
    return LatencyLine(base, slope, max(margin, 0.0))


class WaitPredictor:
    def __init__(
        self,
        rate: BusyRate | None = None,
        floor_calls: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate or BusyRate()
        self._calls: deque[float] = deque(maxlen=floor_calls)
        self._fits = {p: LatencyFit(clock=clock) for p in ALL_PRIORITIES}
        self._capacity_rows_per_s: float | None = None
        self._work_per_row = 0.0  # a running mean over admitted jobs

    def set_capacity(self, rows_per_s: float | None) -> None:
        """The replica's capacity in inputs a second (None: not known)."""
        self._capacity_rows_per_s = rows_per_s if rows_per_s and rows_per_s > 0 else None

    def note_job(self, work: int, rows: int) -> None:
        """A job of `rows` inputs weighing `work` was admitted."""
        if rows <= 0:
            return
        row = work / rows
        previous = self._work_per_row
        self._work_per_row = row if not previous else 0.95 * previous + 0.05 * row

    def service_rate(self) -> float | None:
        """Work a second: the better of the replica's capacity and the rate measured
        here, whichever are known; None before either is (cold start)."""
        known = [rate for rate in (self._capacity_per_s(), self.rate.per_s()) if rate]
        return max(known) if known else None

    def _capacity_per_s(self) -> float | None:
        if self._capacity_rows_per_s is None or not self._work_per_row:
            return None
        return self._capacity_rows_per_s * self._work_per_row

    def call_took(self, seconds: float) -> None:
        """A call to the model returned after `seconds` (sent to answered)."""
        self._calls.append(max(seconds, 0.0))

    def floor_s(self) -> float | None:
        return min(self._calls) if self._calls else None

    def predict(self, priority: Priority, ahead_work: int, work: int) -> Prediction:
        """Seconds from now to the answer of `work` behind `ahead_work`."""
        rate = self.service_rate()
        floor = self.floor_s() or 0.0
        if rate is None:  # cold start
            return Prediction(floor + (ahead_work + work) / COLD_START_WORK_PER_S, 0.0, cold=True)
        queue = (ahead_work + work) / rate
        line = self._fits[priority].line
        seconds = floor + queue if line is None else line.predict_s(queue)
        return Prediction(seconds, queue)

    def observe(self, priority: Priority, prediction: Prediction, measured_s: float) -> None:
        """An admitted request of `priority` was answered `measured_s` after its prediction.
        A miss counts as at most four times the prediction: a request that waited out a
        60 s deadline must pull the fit up, not make one sample the whole spread."""
        if prediction.cold:
            return
        clipped = min(measured_s, 4 * max(prediction.seconds, 0.025))
        self._fits[priority].observe(prediction.queue_s, clipped)

    def report(self) -> dict[str, object]:
        floor = self.floor_s()
        rate = self.service_rate()
        capacity = self._capacity_rows_per_s
        return {
            **self.rate.report(),
            "capacity_inputs_per_s": None if capacity is None else round(capacity, 1),
            "work_per_input": round(self._work_per_row, 1),
            "service_rate_per_s": None if rate is None else round(rate, 1),
            "call_floor_ms": None if floor is None else round(floor * 1e3, 1),
            "fit": {p.label: _line_report(f.line) for p, f in self._fits.items()},
        }


def _line_report(line: LatencyLine | None) -> dict[str, float] | None:
    if line is None:
        return None
    return {
        "base_ms": round(line.base_s * 1e3, 1),
        "slope": round(line.slope, 2),
        "spread_ms": round(line.spread_s * 1e3, 1),
    }
