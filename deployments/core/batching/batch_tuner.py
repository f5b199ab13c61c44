"""A replica's live batching state: what its passes cost, how fast each class's items
arrive, and the plans `batch_policy` derives from them.

The replica tells the tuner about every arrival and every pass; after each it asks for the
plans and applies those that changed (Serve's batch queues take a new size and wait at any
time, the class's `BatchBudget` a new token budget).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from deployments.core.batching.arrival_rate import ArrivalRate
from deployments.core.batching.batch_policy import (
    GROW_BELOW,
    BatchPlan,
    ClassLimits,
    SlotControl,
    plan_classes,
    window_p99,
)
from deployments.core.batching.cost_model import CostModel
from deployments.core.memory.token_backoff import TokenBackoff

# How long the classes above one must have sent nothing before it runs its passes at its
# `alone_max_batch_tokens`: longer than the gaps of a light but steady higher class, so a
# realtime client sending a few requests a second keeps the lower classes' passes short.
ALONE_AFTER_S = 2.0
# How recent the passes of the classes above must be for a class to match their length.
COMPANY_WINDOW_S = 1.0
# How many of a class's last answers tell whether it has time to spare.
SLACK_WINDOW = 64
# How long a call's word that the ingress refuses some of its class holds: a class under
# steady load sends calls far more often, and one whose calls stop has no queue to spare.
SHEDDING_FRESH_S = 2.0


class BatchTuner:
    def __init__(
        self,
        classes: list[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`classes`: the class names, most urgent first."""
        self.cost = CostModel()
        self._clock = clock
        self._classes = list(classes)
        self._arrivals = {name: ArrivalRate(clock=clock) for name in classes}
        self._last_arrival = dict.fromkeys(classes, -math.inf)
        self._tokens_per_row = 0.0  # a running mean of the padded row length
        self._limits: dict[str, ClassLimits] = {}
        self._slots: dict[str, SlotControl] = {}
        self._last_plans: dict[str, BatchPlan] = {}
        # Each class's recent passes: when each ended and its padded tokens.
        self._recent_passes: dict[str, deque[tuple[float, int]]] = {
            name: deque(maxlen=256) for name in classes
        }
        self.backoff = TokenBackoff()
        self.adaptive = True
        # Each class's last answers' latencies, and the target the ingress admits it by.
        self._answered: dict[str, deque[float]] = {
            name: deque(maxlen=SLACK_WINDOW) for name in classes
        }
        self._admission_targets: dict[str, float | None] = {}
        self._shedding_at: dict[str, float] = {}

    def configure(self, limits: dict[str, ClassLimits], adaptive: bool) -> None:
        self._limits = dict(limits)
        self.adaptive = adaptive
        self._slots = {
            name: SlotControl(one, self._clock)
            for name, one in limits.items()
            if one.target_s is not None
        }

    def target_s(self, name: str) -> float | None:
        """The class's latency target, where the config sets one."""
        limits = self._limits.get(name)
        return None if limits is None else limits.target_s

    def admitted_by(self, name: str, target_s: float | None, shedding: bool = False) -> None:
        """What a call of class `name` says of the ingress: the latency target it admits
        the class by, and whether it is refusing some of the class."""
        self._admission_targets[name] = target_s
        self._shedding_at[name] = self._clock() if shedding else -math.inf

    def has_slack(self, name: str) -> bool:
        """Whether class `name` has time to spare: the ingress refuses none of it (as its
        last call, at most `SHEDDING_FRESH_S` old, said) and the p99 of its last answers
        is under `GROW_BELOW` of its target (the model's own `target_p99_ms`, else the one
        the ingress admits by; with neither, the latency says nothing). Only then may its
        passes carry a lower class's batches."""
        if self._clock() - self._shedding_at.get(name, -math.inf) < SHEDDING_FRESH_S:
            return False
        target = self.target_s(name) or self._admission_targets.get(name)
        if target is None:
            return True
        return window_p99(list(self._answered[name])) < target * GROW_BELOW

    def waited(self, name: str, jobs: list[tuple[float, float, float]]) -> None:
        """A pass's jobs of class `name`: when each reached the replica, its latency from
        its request's arrival at the ingress to the end of the pass, and how long it waited
        at the replica before the pass began. Until the cost
        model has a fit the slot plans nothing, so what the jobs saw says nothing of it
        (the first passes of a replica are slow for reasons of their own)."""
        if name in self._answered:
            self._answered[name].extend(latency for _, latency, _ in jobs)
        control = self._slots.get(name)
        if control is None or self.cost.current is None:
            return
        for arrived, latency, replica_wait in jobs:
            control.observe(latency, arrived, replica_wait)

    def arrived(self, name: str, items: int, company: bool = True) -> None:
        """`items` of class `name` reached the replica. `company`: other jobs of the class
        were there already (queued or in a pass), or the call brought several. Only such
        items say that waiting could fill a batch: a lone client's next request cannot
        arrive while it waits for this one, however fast it sends, and counting it would
        make it wait out the window on every request. Any arrival at all keeps the classes
        below from running alone."""
        self._last_arrival[name] = self._clock()
        if company:
            self._arrivals[name].add(items)

    def set_memory_ceiling(self, tokens: int | None) -> None:
        """The padded tokens the warm-up probe measured room for: no plan goes above it."""
        self.backoff.ceiling = tokens

    def memory_fault(self, padded_tokens: int) -> None:
        """A pass of `padded_tokens` ran out of memory: every class's budget halves."""
        self.backoff.fault(padded_tokens)

    def ran(self, name: str, rows: int, padded_tokens: int, seconds: float) -> None:
        self.backoff.success(
            max((one.max_batch_tokens for one in self._limits.values()), default=0)
        )
        self.cost.observe(rows, padded_tokens, seconds)
        if name in self._recent_passes:
            self._recent_passes[name].append((self._clock(), padded_tokens))
        plan = self._last_plans.get(name)
        if (
            plan is not None
            and plan.bounded_by_slot
            and padded_tokens >= 0.8 * plan.max_batch_tokens
        ):
            for control in self._slots.values():
                control.note_binding()
        row = padded_tokens / rows if rows else 0.0
        previous = self._tokens_per_row
        self._tokens_per_row = row if not previous else 0.9 * previous + 0.1 * row

    def plans(self) -> dict[str, BatchPlan]:
        plans = self._in_company(self._alone(self._plans()))
        cap = self.backoff.limit()
        if cap is not None:
            # The fault's cap when there is one (it is never above the ceiling).
            reason = "memory backoff" if self.backoff.cap is not None else "memory ceiling"
            plans = {
                name: replace(plan, max_batch_tokens=cap, why=f"{plan.why}, {reason}")
                if plan.max_batch_tokens > cap
                else plan
                for name, plan in plans.items()
            }
        self._last_plans = plans
        return plans

    def _alone(self, plans: dict[str, BatchPlan]) -> dict[str, BatchPlan]:
        """A class with an `alone_max_batch_tokens` gets it while every class above has
        been quiet for ALONE_AFTER_S: its passes are kept short for their sake only. The
        full pass is still bounded in time, so that the first request of a higher class to
        come back waits out one pass of at most `alone_max_pass_s`, never seconds of long
        texts."""
        now = self._clock()
        quiet_above = True
        for name in self._classes:
            one = self._limits.get(name)
            plan = plans.get(name)
            if quiet_above and plan is not None and one is not None:
                alone = self._alone_budget(one)
                if alone is not None and alone > plan.max_batch_tokens:
                    plans[name] = replace(
                        plan,
                        max_batch_tokens=alone,
                        why=f"{plan.why}, alone",
                        bounded_by_slot=False,
                    )
            quiet_above = quiet_above and now - self._last_arrival[name] >= ALONE_AFTER_S
        return plans

    def _in_company(self, plans: dict[str, BatchPlan]) -> dict[str, BatchPlan]:
        """A class kept to short passes for the sake of the classes above it may run passes
        as long as theirs while they are busy: a request of a higher class already waits
        behind passes that long, so short ones would buy it nothing and cost the model
        throughput (under a normal-class flood, 6-text batch-class passes took ~40 % of
        the device for a quarter of the texts). Up to the class's budget alone, never more."""
        now = self._clock()
        above = 0.0  # the mean padded tokens of the recent passes of the classes above
        for name in self._classes:
            one = self._limits.get(name)
            plan = plans.get(name)
            if one is not None and plan is not None and above > plan.max_batch_tokens:
                budget = min(int(above), self._alone_budget(one) or 0)
                if budget > plan.max_batch_tokens:
                    plans[name] = replace(
                        plan,
                        max_batch_tokens=budget,
                        why=f"{plan.why}, in company",
                        bounded_by_slot=False,
                    )
            above = max(above, self._recent_pass_tokens(name, now))
        return plans

    def _recent_pass_tokens(self, name: str, now: float) -> float:
        passes = self._recent_passes.get(name)
        if not passes:
            return 0.0
        while passes and now - passes[0][0] > COMPANY_WINDOW_S:
            passes.popleft()
        return sum(tokens for _, tokens in passes) / len(passes) if passes else 0.0

    def _alone_budget(self, limits: ClassLimits) -> int | None:
        """The class's token budget while alone: None when it has none, or while a pass
        cannot be timed yet (no cost fit)."""
        budget = limits.alone_max_batch_tokens
        if budget is None or limits.alone_max_pass_s is None:
            return budget
        fit = self.cost.current
        if fit is None:
            return None
        return min(budget, fit.tokens_within(limits.alone_max_pass_s, self._tokens_per_row or 1.0))

    def _plans(self) -> dict[str, BatchPlan]:
        if not self.adaptive:
            return {
                name: BatchPlan(one.max_batch_size, one.max_batch_tokens, one.wait_s, "fixed")
                for name, one in self._limits.items()
            }
        return plan_classes(
            self._limits,
            {name: rate.per_s() for name, rate in self._arrivals.items()},
            self.cost.current,
            self._tokens_per_row or 1.0,
            {name: control.slot_s for name, control in self._slots.items()},
        )

    def full_pass_rows_per_s(self, passes: int = 1) -> float | None:
        """Inputs a second the replica gets through when every pass is as full as the
        largest class allows, rows as long as the recent ones: its capacity, which the
        ingress's admission divides queued work by (a rate measured at the ingress only
        shows it once the model has been saturated). None before the cost model's fit."""
        fit = self.cost.current
        if fit is None or not self._limits or not self._tokens_per_row:
            return None
        row = self._tokens_per_row
        rows = max(
            max(1, min(one.max_batch_size, int(self._largest_budget(one) // row)))
            for one in self._limits.values()
        )
        seconds = fit.predict_s(rows, int(rows * row))
        return passes * rows / seconds if seconds > 0 else None

    def _largest_budget(self, limits: ClassLimits) -> int:
        return max(limits.max_batch_tokens, self._alone_budget(limits) or 0)

    def report(self) -> dict[str, object]:
        fit = self.cost.current
        return {
            "adaptive": self.adaptive,
            "cost_model": fit.report() if fit else None,
            "tokens_per_row": round(self._tokens_per_row, 1),
            "arrivals_per_s": {n: round(r.per_s(), 2) for n, r in self._arrivals.items()},
            "targets": {name: control.report() for name, control in self._slots.items()},
            # Whether each class's passes may carry a lower class's batches now.
            "slack": {name: self.has_slack(name) for name in self._classes},
        }
