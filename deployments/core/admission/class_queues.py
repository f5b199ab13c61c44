"""One model's queues at the ingress: a coalescer per priority class behind admission.

Each class has its own coalescer with its own calls in flight, so a realtime request
never waits behind a batch-class group at the ingress; the model deployment then orders
the classes' batches at its priority gate.

Admission checks the fixed bounds (in inputs), then (with `predict_wait`) the predicted
wait: the work (`work_of`, tokens for the encoders: `job_work.py`) admitted and not yet
answered in the request's class and the classes above it, through the `WaitPredictor`,
against the class's target or the request's deadline, the shorter. Every admitted
request's measured latency corrects the predictor, and how often admitted requests missed
their class's target sets how much of it admission aims at (`target_aim.py`), and the
admitted requests still waiting past their predicted answer add their lateness to the
predictions behind them at once (`lateness.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from deployments.core.admission.admission import Admission, ClassLimits, Refusal, wait_refusal
from deployments.core.admission.coalescer import Coalescer, DeadlineExpired, Send
from deployments.core.admission.lateness import OpenLateness
from deployments.core.admission.target_aim import TargetAim
from deployments.core.admission.throughput import RateMeter
from deployments.core.admission.wait_predictor import Prediction, WaitPredictor
from deployments.core.priority import ALL_PRIORITIES, Priority

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")

# An open request counts towards its class's lateness for twice its class's target (at
# least this long): past that it is stuck, not late (lateness.py).
MIN_LATENESS_WINDOW_S = 1.0


class Refused(Exception):
    def __init__(self, priority: Priority, refusal: Refusal) -> None:
        super().__init__(f"{priority.label}: {refusal.reason}")
        self.priority = priority
        self.refusal = refusal


@dataclass(frozen=True)
class ClassSettings:
    limits: ClassLimits
    max_in_flight: int
    target_s: float | None = None  # latency target from arrival; None = the deadline only


class ClassQueues(Generic[Job, Outcome]):
    def __init__(
        self,
        send: Callable[[Priority], Send[Job, Outcome]],
        settings: Mapping[Priority, ClassSettings],
        *,
        size_of: Callable[[Job], int],
        max_group_items: int,
        work_of: Callable[[Job], int] | None = None,
        on_abandon: Callable[[Job], None] | None = None,
        meter: RateMeter | None = None,
        predictor: WaitPredictor | None = None,
        predict_wait: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._size_of = size_of
        self._work_of = work_of or size_of
        self._admission = Admission({p: s.limits for p, s in settings.items()})
        self._targets = {p: s.target_s for p, s in settings.items()}
        # Realtime is never shed (admission.py), and its misses come from the CPU its
        # requests share, not from a queue a refusal would shorten: it aims at its target.
        self._aims = {
            p: TargetAim(clock=clock) for p in ALL_PRIORITIES if p is not Priority.REALTIME
        }
        self._meter = meter or RateMeter()
        self.predictor = predictor or WaitPredictor()
        self._predict_wait = predict_wait
        self._clock = clock
        self._lateness = OpenLateness(
            {p: max(MIN_LATENESS_WINDOW_S, 2 * (s.target_s or 0.0)) for p, s in settings.items()}
        )
        # Work admitted and not yet answered (queued here or in a call), per class.
        self._open_work = dict.fromkeys(ALL_PRIORITIES, 0)
        self._refused: dict[tuple[Priority, str], int] = {}
        self._coalescers: dict[Priority, Coalescer[Job, Outcome]] = {
            priority: Coalescer(
                self._timed(priority, send(priority)),
                size_of=size_of,
                max_in_flight=settings[priority].max_in_flight,
                max_group_items=max_group_items,
                on_abandon=on_abandon,
            )
            for priority in ALL_PRIORITIES
        }

    def queued_items(self) -> dict[Priority, int]:
        return {p: c.queued_items for p, c in self._coalescers.items()}

    def load(self, priority: Priority) -> tuple[int, int]:
        """The class's items waiting here and its calls out to the model now."""
        coalescer = self._coalescers[priority]
        return coalescer.queued_items, coalescer.in_flight

    def work_ahead(self, priority: Priority) -> int:
        """Work admitted and not yet answered in `priority` and the classes above it: what
        the replica's gate puts before a new request of `priority`."""
        return sum(self._open_work[p] for p in ALL_PRIORITIES if p <= priority)

    def _timed(self, priority: Priority, send: Send[Job, Outcome]) -> Send[Job, Outcome]:
        """`send`, telling the predictor how long each call took and how busy the model was."""

        async def timed(
            jobs: list[Job], time_left: list[float | None], spent: list[float]
        ) -> list[Outcome]:
            work = sum(self._work_of(job) for job in jobs)
            self.predictor.rate.started()
            started = self._clock()
            answered = 0
            try:
                outcomes = await send(jobs, time_left, spent)
                answered = work
                self.predictor.call_took(self._clock() - started)
                return outcomes
            finally:
                self.predictor.rate.ended(answered)

        return timed

    async def submit(
        self,
        priority: Priority,
        job: Job,
        deadline: float | None,
        since: float | None = None,
    ) -> Outcome:
        """The job's outcome. Raises Refused when admission turns it away, or
        DeadlineExpired when `deadline` (event-loop clock) passes first. `since`: when the
        job's request arrived (time.monotonic())."""
        size = self._size_of(job)
        refusal = self._admission.check(priority, size, self.queued_items(), self._meter.rate())
        prediction = None
        work = self._work_of(job)
        self.predictor.note_job(work, size)
        if refusal is None and self._predict_wait:
            prediction, refusal = self._predicted(priority, work, deadline, since)
        if refusal is not None:
            key = (priority, refusal.reason)
            self._refused[key] = self._refused.get(key, 0) + 1
            raise Refused(priority, refusal)
        admitted = self._clock()
        self._open_work[priority] += work
        token = (
            None
            if prediction is None
            else self._lateness.admitted(priority, admitted, prediction.seconds)
        )
        try:
            outcome = await self._coalescers[priority].submit(job, deadline, since)
        except DeadlineExpired:
            # An admitted request that ran out of time is the prediction's worst miss.
            if prediction is not None:
                self._learn(priority, prediction, admitted, since)
            raise
        finally:
            self._open_work[priority] -= work
            if token is not None:
                self._lateness.closed(priority, token)
        self._meter.add(size)
        if prediction is not None:
            self._learn(priority, prediction, admitted, since)
        return outcome

    def _learn(
        self, priority: Priority, prediction: Prediction, admitted: float, since: float | None
    ) -> None:
        """After an admitted job's answer (or its deadline's miss): the wait it had teaches
        the predictor, and the time since its arrival tells the class's aim whether it came
        within the target."""
        now = self._clock()
        self.predictor.observe(priority, prediction, now - admitted)
        target = self._targets.get(priority)
        if target is not None and priority in self._aims:
            arrived = admitted if since is None else since
            self._aims[priority].answered(now - arrived, target)

    def _predicted(
        self, priority: Priority, work: int, deadline: float | None, since: float | None
    ) -> tuple[Prediction, Refusal | None]:
        ahead = self.work_ahead(priority)
        prediction = self.predictor.predict(priority, ahead, work)
        if late := self._lateness.late_s(priority, self._clock()):
            prediction = replace(prediction, seconds=prediction.seconds + late)
        budgets = []
        target = self._targets.get(priority)
        if target is not None:
            # The target runs from the request's arrival; parsing it has spent some.
            spent = 0.0 if since is None else max(self._clock() - since, 0.0)
            aim = self._aims[priority].aim if priority in self._aims else 1.0
            budgets.append(target * aim - spent)
        if deadline is not None:
            budgets.append(deadline - asyncio.get_running_loop().time())
        if not budgets:
            return prediction, None
        return prediction, wait_refusal(priority, prediction, min(budgets), ahead)

    def stats(self) -> dict[str, Any]:
        now = self._clock()
        classes: dict[str, Any] = {}
        for priority, coalescer in self._coalescers.items():
            refused = {reason: n for (p, reason), n in self._refused.items() if p is priority and n}
            classes[priority.label] = {**vars(coalescer.stats), "refused": refused}
        return {
            "items_per_s": round(self._meter.rate(), 1),
            "predicted_wait": {
                "enabled": self._predict_wait,
                **self.predictor.report(),
                "target_aim": {p.label: a.report() for p, a in self._aims.items()},
                "late_ms": {
                    p.label: round(1e3 * self._lateness.late_s(p, now), 1) for p in ALL_PRIORITIES
                },
            },
            "classes": classes,
        }


def loop_deadline(timeout_s: float | None) -> float | None:
    """An absolute deadline on the running loop's clock, `timeout_s` from now."""
    if timeout_s is None:
        return None
    return asyncio.get_running_loop().time() + timeout_s
