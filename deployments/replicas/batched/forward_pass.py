"""A formed batch's way through the model: its turn at the priority gate, the drop of items
nobody waits for any more, the task's `compute` on a model thread, and what the pass teaches.

The gate lets one forward pass run at a time (or as many as the model threads), the most
urgent waiting batch first, with ageing so the batch class always moves
(core/batching/priority_gate.py). Just before the pass, items whose job ran out of time or
lost its client are dropped, so the model never computes them. A pass that runs out of
memory is split and retried (core/memory/split_retry.py) and halves the token budget; any
other pass feeds the tuner its size, cost and the latency its jobs saw.

A normal or batch-class batch waits at the gate as a `WaitingBatch` too: a pass of either
class that starts with room left in its budget takes such batches along
(core/batching/shared_pass.py), and their own turns are given back unused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

from deployments.core.batching.batch_tuner import BatchTuner
from deployments.core.batching.busy_share import BusyShare
from deployments.core.batching.priority_gate import PriorityGate
from deployments.core.memory.split_retry import SplitReport, run_split
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority
from deployments.replicas.batched.batched_jobs import (
    EXPIRED,
    BatchItem,
    Dropped,
    JobState,
    split_live,
)
from deployments.replicas.batched.model_threads import ModelThreads
from deployments.replicas.batched.pass_counters import PassCounters
from deployments.replicas.batched.replica_memory import ReplicaMemory
from deployments.replicas.batched.waiting_batches import WaitingBatch, WaitingBatches
from deployments.replicas.device_turns import ReplicaTurns
from deployments.replicas.memory import is_memory_fault, release_cached_memory

logger = logging.getLogger("ray.serve")

# Classes whose batches share passes. Realtime passes stay as small as they formed: their
# target is tens of milliseconds, and they have the lane.
SHARING = (Priority.NORMAL, Priority.BATCH)
# One class's items in a pass, as the gate saw them formed.
Group = tuple[Priority, list[Any]]


class ForwardPasses:
    def __init__(
        self,
        name: str,
        compute: Callable[[list[Any]], list[Any]],
        threads: ModelThreads,
        tuner: BatchTuner,
        retune: Callable[[], None],
        counters: PassCounters,
        memory: ReplicaMemory,
        metrics: TributaryMetrics,
    ) -> None:
        """`compute`: the task's forward pass over live items; `retune`: hands the tuner's
        plans to the queues after it learned something."""
        self._name = name
        self._compute = compute
        self._threads = threads
        self._tuner = tuner
        self._retune = retune
        self._counters = counters
        self._memory = memory
        self._metrics = metrics
        self.gate = PriorityGate({}, capacity=threads.passes, lane=threads.has_lane)
        self.busy = BusyShare(lanes=threads.passes)
        self.turns: ReplicaTurns | None = None  # set once the replica opens its device's
        self.shared = True  # passes take waiting batches along (batching.shared_passes)
        self.waiting = WaitingBatches()

    async def run(self, priority: Priority, items: list[Any]) -> list[Any]:
        """One batch of the class: per item its result, a `Dropped`, or the exception it
        failed with."""
        if self.shared and priority in SHARING:
            waiting = self.waiting.add(priority, items)
            granted = await self._turn_or_ride(waiting)
            if granted is None:
                return await waiting.results
            lane = granted
        else:
            lane = await self.gate.acquire(priority)
        try:
            # The lane runs beside the pass holding the device: it takes no device turn.
            if lane or self.turns is None:
                return await self._run_live(priority, items, lane)
            urgent_at = self._urgent_at(priority, items)
            taken = None
            if priority is Priority.REALTIME and self.gate.lane_free:
                taken = self.turns.take_now(priority, urgent_at)
                if taken is None:
                    # Another model's pass holds the device: beside it in the lane, rather
                    # than after it.
                    self.gate.move_to_lane()
                    lane = True
                    return await self._run_live(priority, items, lane)
            # Then the device's turn, shared with other models' replicas: the most
            # urgent pass on the device goes first (replicas/device_turns.py).
            # Behind this pass wait the replica's other batches: its turn is asked for at
            # the most urgent one's class, as they can run only after it.
            async with self.turns.turn(
                priority,
                urgent_at,
                self._next_pass,
                behind=self.gate.most_urgent_waiting,
                nudge=self.gate.waiter_came,
                taken=taken,
            ):
                return await self._run_live(priority, items)
        finally:
            self.gate.release(lane, priority)

    async def _turn_or_ride(self, waiting: WaitingBatch) -> bool | None:
        """The gate's turn for a waiting batch (whether it is the lane), or None when
        another pass took the batch along first."""
        acquire = asyncio.ensure_future(self.gate.acquire(waiting.priority))
        waiting.gate_turn = acquire
        try:
            await asyncio.wait((acquire, waiting.taken), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Taken already, its pass computes it for no one; either way the turn goes.
            self.waiting.withdraw(waiting)
            self._give_back(acquire)
            raise
        if self.waiting.withdraw(waiting):
            return await acquire  # granted: the wait above ended, and not by a taker
        self._give_back(acquire)
        return None

    def _give_back(self, acquire: asyncio.Future[bool] | None) -> None:
        """A gate turn a taken batch no longer needs: a pending one is cancelled (and its
        place in the queue at once with it), a granted one released unused."""
        if acquire is None or acquire.cancel():
            return
        if not acquire.cancelled() and acquire.exception() is None:
            self.gate.release(acquire.result())

    def _take_along(self, priority: Priority, items: list[Any], lane: bool) -> list[WaitingBatch]:
        """Waiting batches this pass carries too: none for the lane or a realtime pass; the
        batch class's only while the gate lets that class run; and a class below the
        pass's own only while the pass's class has slack, since under its own load every
        row a pass gives a lower class lengthens the wait of the class's next items (and
        admission, which learns that wait, then lets fewer of them in)."""
        if lane or not self.shared or priority not in SHARING or not items:
            return []
        slack = self._tuner.has_slack(priority.label)
        classes = [p for p in SHARING if not self.gate.keeps_out(p) and (p <= priority or slack)]
        riders = self.waiting.take_along(items, items[0].budget, classes, self._tuner.cost.current)
        for rider in riders:
            self._give_back(rider.gate_turn)
        return riders

    def _next_pass(self) -> tuple[Priority, float] | None:
        """This replica's next batch, ready at the gate as a pass ends: the device may be
        kept for it (replicas/device_turns.py)."""
        waiting = self.gate.next_waiting()
        return None if waiting is None else (waiting, math.inf)

    def _urgent_at(self, priority: Priority, items: list[BatchItem]) -> float:
        """When the batch's earliest deadline or latency target falls due."""
        target = self._tuner.target_s(priority.label)
        due = math.inf
        for state in {id(item.state): item.state for item in items}.values():
            if state.deadline is not None:
                due = min(due, state.deadline)
            if target is not None:
                due = min(due, state.began + target)
        return due

    async def _run_live(
        self, priority: Priority, items: list[Any], lane: bool = False
    ) -> list[Any]:
        """The pass itself, on a model thread (the lane's where `lane`), over the items
        still wanted, with the waiting batches it takes along."""
        # One loop turn first: a cancel or a forget note that arrived during the last
        # forward pass (or the wait for the device) is queued on this loop, and must
        # land before we decide.
        await asyncio.sleep(0)
        riders = self._take_along(priority, items, lane)
        groups: list[Group] = [(priority, items), *((r.priority, r.items) for r in riders)]
        if not riders:
            return (await self._run_groups(groups, lane))[0]
        # The riders' results come from this pass even if its own callers go away.
        shared = asyncio.ensure_future(self._run_groups(groups, lane))
        shared.add_done_callback(partial(_deliver, riders))
        return (await asyncio.shield(shared))[0]

    async def _run_groups(self, groups: list[Group], lane: bool) -> list[list[Any]]:
        """One pass over every group's live items, led by the first group's class; per
        group, per item, its result or its `Dropped` mark."""
        priority = groups[0][0]
        started = time.monotonic()
        marked: list[list[Dropped | None]] = []
        live: list[Any] = []
        live_by_class: list[tuple[Priority, list[Any]]] = []
        for klass, items in groups:
            its_live, marks = split_live(items, started)
            self._note_drops(klass, marks, items)
            marked.append(marks)
            live.extend(its_live)
            live_by_class.append((klass, its_live))
        results: list[Any] = []
        if live:
            # A realtime pass stops other models' lower passes while it computes, on the
            # lane or not (replicas/device_turns.py, `first_on_the_cores`).
            first = nullcontext() if self.turns is None else self.turns.first_on_the_cores(priority)
            self._memory.before_pass()
            with first:
                results, report = await self._threads.run(
                    run_split,
                    live,
                    self._compute,
                    is_memory_fault,
                    release_cached_memory,
                    lane=lane,
                )
            took_s = time.monotonic() - started
            # One state per job in the batch (its items arrived together).
            states = [(klass, _states_of(its_live)) for klass, its_live in live_by_class]
            for _, its_states in states:
                for state in its_states:
                    state.ran_pass(started, took_s)
            if not lane:  # the lane is not a pass slot: autoscaling reads the slots' share
                self.busy.ran(took_s)
            self._counters.ran(
                priority,
                len(live_by_class[0][1]),
                carried=[(klass, len(its_live)) for klass, its_live in live_by_class[1:]],
            )
            if report.faults:
                self._memory_faulted(priority, live, report)
            else:
                self._measure(priority, live, states, started, lane)
        computed = iter(results)
        return [
            [mark if mark is not None else next(computed) for mark in marks] for marks in marked
        ]

    def _memory_faulted(
        self, priority: Priority, live: list[BatchItem], report: SplitReport
    ) -> None:
        """Count it and halve the token budget. Its time is not a pass's cost, so the cost
        model does not see it."""
        self._memory.faulted(report)
        padded = len(live) * max(item.tokens for item in live)
        self._tuner.memory_fault(padded)
        self._retune()
        logger.warning(
            "%s: a %s pass of %d inputs (%d padded tokens) ran out of memory: %d faults, "
            "%d splits, %d inputs failed alone; token budget now %s",
            self._name,
            priority.label,
            len(live),
            padded,
            report.faults,
            report.splits,
            report.failed_alone,
            self._tuner.backoff.cap,
        )

    def _measure(
        self,
        priority: Priority,
        live: list[BatchItem],
        states: list[tuple[Priority, list[JobState]]],
        started: float,
        lane: bool = False,
    ) -> None:
        """What the pass teaches; `states`: its jobs' per class (the pass's own first), one
        queue wait each. The pass is counted once, in the class that led it."""
        padded_tokens = len(live) * max(item.tokens for item in live)
        inference_s = time.monotonic() - started
        self._metrics.batch_ran(
            self._name,
            priority.label,
            size=len(live),
            padded_tokens=padded_tokens,
            inference_s=inference_s,
            queue_waits_s=[started - state.arrived for state in states[0][1]],
        )
        for klass, its_states in states[1:]:
            self._metrics.queue_waits(
                self._name, klass.label, [started - state.arrived for state in its_states]
            )
        if not lane:  # the cost model is of the main threads' passes
            self._tuner.ran(priority.label, len(live), padded_tokens, inference_s)
        ended = time.monotonic()
        # From the ingress's arrival, not this replica's: a target is the client's, and
        # under load the ingress's queue is part of what it waits. (The hop here is not:
        # the ingress can only say what was spent when the call left.)
        for klass, its_states in states:
            self._tuner.waited(
                klass.label,
                [(s.arrived, ended - s.began, started - s.arrived) for s in its_states],
            )
        self._retune()
        fit = self._tuner.cost.current
        if fit is not None:
            self._metrics.cost_model(self._name, fit)
        self._memory.read_device(self._tuner.backoff.ceiling)

    def _note_drops(
        self, priority: Priority, marks: Sequence[Dropped | None], items: Sequence[BatchItem]
    ) -> None:
        for reason, count in self._counters.dropped(marks, items).items():
            label = "deadline" if reason == EXPIRED else reason
            self._metrics.items_dropped(self._name, priority.label, label, count)


def _states_of(items: list[BatchItem]) -> list[JobState]:
    return list({id(item.state): item.state for item in items}.values())


def _deliver(riders: list[WaitingBatch], shared: asyncio.Future[list[list[Any]]]) -> None:
    """Each carried batch's share of a pass's results, or what the pass failed with."""
    if shared.cancelled():
        for rider in riders:
            rider.fail(asyncio.CancelledError())
        return
    error = shared.exception()
    if error is not None:
        for rider in riders:
            rider.fail(error)
        return
    for rider, results in zip(riders, shared.result()[1:], strict=True):
        rider.deliver(results)
