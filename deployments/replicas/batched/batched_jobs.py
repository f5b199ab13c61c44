"""The job lifecycle of a batched replica, written once for every task that batches items.

One call from the ingress brings jobs of one priority class (one job per HTTP request). The
lifecycle: the task plans every job into items (or refuses it), a job already out of time is
answered at once, every live item goes through the class's batcher (`run_item`: Serve's
`@serve.batch` queue, or a plain coroutine in tests), and each job's results are gathered
back into its outcome. A job any of whose items was dropped or failed is answered for the
whole job; the task only sees jobs whose every item ran.

A task (embed, rerank) is a plug-in with three methods, `plan`, `compute` and `collect`,
and a `what` for logs. This module is Ray-free; `batcher.Batcher` runs it inside Serve.
Every item points at its job's `JobState`; just before a forward pass the replica drops the
items whose job ran out of time or whose client went away (`split_live`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.memory.split_retry import TooLargeForMemory
from deployments.core.protocol import JobTiming, Rejection, deadline_rejection
from deployments.errors import MODEL_FAILED_MESSAGE

logger = logging.getLogger("ray.serve")

EXPIRED = "expired"
CLIENT_GONE = "client_gone"


@dataclass(eq=False)
class JobState:
    """What every item of a job needs to know about it at the last moment."""

    request_id: str
    deadline: float | None  # time.monotonic() clock of this process
    cancelled: bool = False
    # When the job reached this replica: its items' queue wait is measured from here.
    arrived: float = field(default_factory=time.monotonic)
    # When its request reached the ingress, on this process's clock (the ingress sends
    # how long ago): the latency a class's target is judged by starts here.
    began: float = field(default_factory=time.monotonic)
    # Where its time went, for the answer's timing headers: its share of its call's
    # tokenising, when its first forward pass began, and its passes' time.
    tokenize_s: float = 0.0
    first_pass_at: float | None = None
    inference_s: float = 0.0

    def ran_pass(self, started: float, took_s: float) -> None:
        """One forward pass computed some of its inputs."""
        if self.first_pass_at is None:
            self.first_pass_at = started
        self.inference_s += took_s

    def timing(self) -> JobTiming:
        first = self.first_pass_at
        return JobTiming(
            tokenize_s=self.tokenize_s,
            queue_s=0.0 if first is None else max(0.0, first - self.began),
            inference_s=self.inference_s,
        )

    def drop_reason(self, now: float) -> str | None:
        # Expiry first: the ingress also cancels a call whose only job ran out of time.
        if self.deadline is not None and now >= self.deadline:
            return EXPIRED
        if self.cancelled:
            return CLIENT_GONE
        return None


@dataclass(frozen=True)
class Dropped:
    """The result of an item that was never computed."""

    reason: str


class BatchItem(Protocol):
    """What the batcher and the replica read of any task's item."""

    @property
    def budget(self) -> BatchBudget: ...  # `@serve.batch` sizes batches by it

    @property
    def state(self) -> JobState: ...

    @property
    def tokens(self) -> int: ...  # padded length this item costs in a batch


class Plan(Protocol):
    """One job, planned: its items, in the order its results come back to `collect`."""

    @property
    def items(self) -> Sequence[BatchItem]: ...


JobT = TypeVar("JobT", contravariant=True)
PlanT = TypeVar("PlanT", bound=Plan)
OutcomeT = TypeVar("OutcomeT", covariant=True)
ResultT = TypeVar("ResultT")


class JobTask(Protocol[JobT, PlanT, OutcomeT]):
    """A task's plug-in into the lifecycle."""

    what: str  # names the task in logs

    def plan(
        self, jobs: Sequence[JobT], states: Sequence[JobState], budget: BatchBudget
    ) -> list[PlanT | Rejection]:
        """Per job its items, or the Rejection that refuses it before anything runs."""
        ...

    def compute(self, items: list[Any]) -> list[Any]:
        """The forward pass over one batch of live items: one result per item. Runs on
        the replica's model thread."""
        ...

    def collect(self, plan: PlanT, results: list[Any]) -> OutcomeT:
        """A job's outcome from the results of all its items, every one computed."""
        ...


RunItem = Callable[[Any], Awaitable[Any]]


def split_live(
    items: Sequence[BatchItem], now: float
) -> tuple[list[BatchItem], list[Dropped | None]]:
    """The items still worth computing, and per item its Dropped marker or None."""
    marks = [Dropped(reason) if (reason := item.state.drop_reason(now)) else None for item in items]
    return [item for item, mark in zip(items, marks, strict=True) if mark is None], marks


async def run_jobs(
    task: JobTask[JobT, PlanT, OutcomeT],
    jobs: Sequence[JobT],
    states: Sequence[JobState],
    budget: BatchBudget,
    run_item: RunItem,
    on_planned: Callable[[int], None] | None = None,
) -> list[OutcomeT | Rejection]:
    """One outcome per job, in order: the lifecycle of one call's jobs. `on_planned` hears
    how many items are about to be queued, before the first one is."""
    now = time.monotonic()
    planned = task.plan(jobs, states, budget)
    _share_planning(states, jobs, time.monotonic() - now)
    # Expiry wins over the task's own refusal: the deadline is what the client will see.
    plans = [
        deadline_rejection() if state.drop_reason(now) == EXPIRED else plan
        for plan, state in zip(planned, states, strict=True)
    ]
    todo = [item for plan in plans if not isinstance(plan, Rejection) for item in plan.items]
    if on_planned is not None and todo:
        on_planned(len(todo))
    results = await asyncio.gather(*(run_item(item) for item in todo), return_exceptions=True)
    outcomes: list[OutcomeT | Rejection] = []
    start = 0
    for plan, state in zip(plans, states, strict=True):
        if isinstance(plan, Rejection):
            outcomes.append(plan)
            continue
        mine = list(results[start : start + len(plan.items)])
        start += len(plan.items)
        failed = failed_outcome(mine, task.what)
        outcomes.append(failed if failed is not None else _timed(task.collect(plan, mine), state))
    return outcomes


def _share_planning(states: Sequence[JobState], jobs: Sequence[Any], took_s: float) -> None:
    """A call's tokenising, shared among its jobs by their inputs."""
    sizes = [max(1, len(job)) for job in jobs]  # a job's len: the items it weighs
    total = sum(sizes)
    for state, size in zip(states, sizes, strict=True):
        state.tokenize_s = took_s * size / total


def _timed(outcome: ResultT, state: JobState) -> ResultT:
    """The outcome with its job's timing, where its type carries one."""
    if dataclasses.is_dataclass(outcome) and hasattr(outcome, "timing"):
        return dataclasses.replace(outcome, timing=state.timing())  # type: ignore[type-var]
    return outcome


def failed_outcome(results: Sequence[Any], what: str) -> Rejection | None:
    """The answer for a job any of whose items was dropped or failed; None if all ran."""
    dropped = next((r for r in results if isinstance(r, Dropped)), None)
    if dropped is not None:
        if dropped.reason == EXPIRED:
            return deadline_rejection()
        # Nobody is listening; the status only has to be an error.
        return Rejection(499, "The client went away.", code="client_gone")
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if isinstance(failure, TooLargeForMemory):
        return Rejection(413, str(failure), code="input_too_large_for_memory")
    if failure is not None:
        logger.error("%s batch failed: %r", what, failure)
        return Rejection(500, MODEL_FAILED_MESSAGE, code="model_error")
    return None
